"""Run a function right after a module is fully imported, or at once if it already is.

Each source of the training process starts with the library it reads: torch_xla's hooks when torch_xla is imported,
torch.compile's when ``torch._dynamo`` is, TorchNeuron's when ``torch_neuronx`` is; ``autostart`` attaches when
``torch`` is. Nothing here imports a watched
module, so a process that never uses torch_xla never loads it.

"Imported" means the module's code has run to its end. A module can be in ``sys.modules`` half-way through its own
code: ``import torch_xla`` puts torch_xla there, then imports torch, and autostart attaches inside that, while
torch_xla has no ``_XLAC`` yet. The functions for such a module wait for the end of its import: Python marks the
module's spec ``_initializing`` while its code runs and clears the mark when it ends; the spec is given a subclass
whose ``_initializing`` runs the functions when the mark is cleared, on the importing thread, before the ``import``
statement returns. Where that cannot be done (a module that replaced itself in ``sys.modules``, an interpreter
without the mark), the functions run at the next import of any module, or at ``poll()``, whichever finds the module
whole first.

The watcher is a plain object with ``find_spec`` in ``sys.meta_path`` (``importlib.abc`` would cost every Python
process of an environment tens of milliseconds at start-up, see ``autostart``): it finds nothing itself, and wraps
the real loader of a watched module so that the functions run after the module's code. Like ``autostart``, it imports
nothing at start-up that Python has not loaded already (no ``threading``, no ``typing``).
"""

import os
import sys
from _thread import allocate_lock  # what threading.Lock is, without importing threading at start-up

_lock = allocate_lock()


def _new_lock_after_fork() -> None:
    global _lock
    _lock = allocate_lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_after_fork)


def _run(functions) -> None:
    for function in functions:
        try:
            function()
        except Exception as error:  # noqa: BLE001 (they must not raise; if one does, never into the user's import)
            sys.stderr.write(f"neuron-exporter: after an import: {type(error).__name__}: {error}\n")


def _initializing(name):
    """Whether the module ``name`` is in ``sys.modules`` with its code still running."""
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _real_spec(name, path, target):
    """The spec the other finders of ``sys.meta_path`` give, in their order, as the import system asks them."""
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if finder is not _watcher and find_spec is not None:
            spec = find_spec(name, path, target)
            if spec is not None:
                return spec
    return None


class _ImportWatcher:
    def __init__(self):
        self.waiting = {}  # module name -> the functions to call after its import
        self.unfinished = {}  # module name, imported but its code still running -> the functions to call after it

    def find_spec(self, name, path=None, target=None):
        # It never leaves sys.meta_path here (the import system is looping over it), and a watched module's functions
        # wait until its code has run: a look-up alone (importlib.util.find_spec, as libraries probe for torch_xla)
        # or an import that fails leaves them waiting for the next import.
        if self.unfinished:
            with _lock:
                finished = self._take_finished()
            _run(finished)
        if name not in self.waiting:
            return None
        spec = _real_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_run(module):
            exec_module(module)
            with _lock:
                functions = self.waiting.pop(name, [])
                self._leave_if_idle()
            _run(functions)

        spec.loader.exec_module = exec_then_run
        return spec

    def _take_finished(self) -> list:
        """The functions of the unfinished modules whose import has ended (those that failed are dropped)."""
        finished = []
        for name in [name for name in self.unfinished if not _initializing(name)]:
            functions = self.unfinished.pop(name)
            if name in sys.modules:
                finished.extend(functions)
        return finished

    def _leave_if_idle(self) -> None:
        if not self.waiting and not self.unfinished and self in sys.meta_path:
            sys.meta_path.remove(self)

    def _join(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)


_watcher = _ImportWatcher()


def _call_when_the_mark_is_cleared(name) -> bool:
    """Give the spec of ``name`` (being imported) a class whose ``_initializing`` runs the module's unfinished
    functions when Python clears it. False where the spec cannot take it."""
    spec = getattr(sys.modules.get(name), "__spec__", None)
    if spec is None or type(spec).__name__ == "_WatchedSpec" or "_initializing" not in vars(spec):
        return type(spec).__name__ == "_WatchedSpec"

    class _WatchedSpec(type(spec)):  # type: ignore[misc]
        @property
        def _initializing(self):
            return self.__dict__.get("_initializing", False)

        @_initializing.setter
        def _initializing(self, value):
            self.__dict__["_initializing"] = value
            if not value:
                with _lock:
                    functions = _watcher.unfinished.pop(name, []) if name in sys.modules else []
                    _watcher._leave_if_idle()
                _run(functions)

    try:
        spec.__class__ = _WatchedSpec
    except TypeError:
        return False
    return True


def after_import(name: str, function) -> None:
    """Call ``function()`` right after ``name`` is fully imported (on the importing thread), or now if it already
    is. ``function`` must not raise."""
    with _lock:
        if name in sys.modules and not _initializing(name):
            pass
        else:
            table = _watcher.unfinished if name in sys.modules else _watcher.waiting
            functions = table.setdefault(name, [])
            if function not in functions:
                functions.append(function)
            _watcher._join()  # for a module not yet imported, and for the next chance of an unfinished one
            if table is _watcher.unfinished:
                _call_when_the_mark_is_cleared(name)
            return
    function()


def poll() -> None:
    """Run the functions of modules whose import ended without anyone noticing (see the module's text): a cheap
    check, called at the training thread's chances (an optimizer created, a step)."""
    if not _watcher.unfinished:
        return
    with _lock:
        finished = _watcher._take_finished()
        _watcher._leave_if_idle()
    _run(finished)


def forget(function) -> None:
    """Do not call ``function`` after any import it waits for."""
    with _lock:
        for table in (_watcher.waiting, _watcher.unfinished):
            for name, functions in list(table.items()):
                if function in functions:
                    functions.remove(function)
                if not functions:
                    del table[name]
        _watcher._leave_if_idle()
