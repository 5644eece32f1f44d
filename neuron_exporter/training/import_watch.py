"""Run a function right after a module is imported, or at once if it already is.

Each source of the training process starts with the library it reads: torch_xla's hooks when torch_xla is imported,
torch.compile's when ``torch._dynamo`` is; ``autostart`` attaches when ``torch`` is. Nothing here imports a watched
module, so a process that never uses torch_xla never loads it.

The watcher is a plain object with ``find_spec`` in ``sys.meta_path`` (``importlib.abc`` would cost every Python
process of an environment tens of milliseconds at start-up, see ``autostart``): it finds nothing itself, and wraps
the real loader of a watched module so that the functions run after the module's code. Like ``autostart``, it imports
nothing at start-up that Python has not loaded already (no ``threading``, no ``typing``).
"""

import sys
from _thread import allocate_lock  # what threading.Lock is, without importing threading at start-up

_lock = allocate_lock()


class _ImportWatcher:
    def __init__(self):
        self.waiting = {}  # module name -> the functions to call after its import

    def find_spec(self, name, path=None, target=None):
        with _lock:
            functions = self.waiting.pop(name, None)
            if not self.waiting and self in sys.meta_path:
                sys.meta_path.remove(self)
        if functions is None:
            return None
        import importlib.util

        spec = importlib.util.find_spec(name)  # the real one: this watcher no longer answers for the name
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_run(module):
            exec_module(module)
            for function in functions:
                function()

        spec.loader.exec_module = exec_then_run  # type: ignore[method-assign]
        return spec


_watcher = _ImportWatcher()


def after_import(name: str, function) -> None:
    """Call ``function()`` right after ``name`` is imported (on the importing thread), or now if it already is.
    ``function`` must not raise."""
    with _lock:
        if name not in sys.modules:
            waiting = _watcher.waiting.setdefault(name, [])
            if function not in waiting:
                waiting.append(function)
            if _watcher not in sys.meta_path:
                sys.meta_path.insert(0, _watcher)
            return
    function()


def forget(function) -> None:
    """Do not call ``function`` after any import it waits for."""
    with _lock:
        for name, functions in list(_watcher.waiting.items()):
            if function in functions:
                functions.remove(function)
            if not functions:
                del _watcher.waiting[name]
        if not _watcher.waiting and _watcher in sys.meta_path:
            sys.meta_path.remove(_watcher)
