"""Sites: the source line that made a graph run, found by a cheap walk up the Python stack.

A site is the innermost frame that is not in torch, torch_xla, torch_neuronx, this package, the standard library
(``functools`` wrappers among it) or a package of decorators (``typing_extensions``, whose ``deprecated`` wraps
``xm.mark_step`` in torch_xla 2.9). Library code such as transformers counts (a cut inside
``transformers/masking_utils.py`` is reported there). Whether a code object is skipped, and how its file is written,
is decided once per code object and cached, so a walk costs well under a microsecond for a short stack; no
traceback is ever built.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
import weakref
from types import CodeType, FrameType

import torch

UNKNOWN = "unknown"
MAX_FRAMES = 4  # frames kept for the detailed view: the site and the callers above it
MAX_WALK = 200  # frames walked at most, looking for the user's line above a site in an installed package
# Packages whose frames only wrap the caller's function (deprecation warnings, decorators): never a site.
WRAPPER_PACKAGES = ("typing_extensions", "wrapt", "decorator", "deprecated")
MAX_CODES = 20_000  # live code objects remembered (one dead is forgotten at once)
MAX_LINES = 20_000  # sites' lines remembered, over all live code objects


def module_directory(module) -> str | None:
    """The directory of a module or of a module spec, with a trailing separator: where its file is, or a namespace
    package's first directory; None for one that has neither (made in memory)."""
    path = getattr(module, "__file__", None) or getattr(module, "origin", None)
    if isinstance(path, str) and path:
        return os.path.dirname(os.path.abspath(path)) + os.sep
    spec = getattr(module, "__spec__", None)
    locations = getattr(module, "__path__", None) or getattr(spec or module, "submodule_search_locations", None)
    for location in locations or ():
        return os.path.abspath(location) + os.sep
    return None


def _skipped_packages() -> tuple[str, ...]:
    import neuron_exporter

    modules = [torch, neuron_exporter]
    modules += [sys.modules[library] for library in ("torch_xla", "torch_neuronx") if library in sys.modules]
    directories = [module_directory(module) for module in modules]  # a device's own Python code, when it runs here
    return tuple(directory for directory in directories if directory) + _wrapper_paths()


def _wrapper_paths() -> tuple[str, ...]:
    """The files or directories of the installed WRAPPER_PACKAGES, found without importing them."""
    paths = []
    for name in WRAPPER_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.origin or not os.path.isabs(spec.origin):
            continue
        # A package is skipped as a whole, a single-file module (typing_extensions.py) as that file.
        origin = os.path.abspath(spec.origin)
        paths.append(os.path.dirname(origin) + os.sep if spec.submodule_search_locations else origin)
    return tuple(paths)


def _site_packages() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    directories = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    return tuple(os.path.abspath(d) + os.sep for d in directories)


class SiteFinder:
    def __init__(self, cwd: str | None = None):
        self._packages = _skipped_packages()
        self._site_packages = _site_packages()
        paths = sysconfig.get_paths()
        self._stdlib = tuple({os.path.abspath(paths[key]) + os.sep for key in ("stdlib", "platstdlib")})
        self._roots = sorted(
            {os.path.abspath(p) + os.sep for p in sys.path if p and os.path.isdir(p)}, key=len, reverse=True
        )
        self._cwd = os.path.abspath(cwd or os.getcwd()) + os.sep
        self._files: dict[str, tuple[str, bool, bool]] = {}  # file -> (as shown, skipped, in an installed package)
        # Keyed by id(): a code object's own hash covers its constants and bytecode, and costs up to a microsecond.
        # The entry holds only a weak reference to the code object, whose end removes the entry (before its id
        # can be reused), so code that is exec'd and dropped is not kept alive here.
        # -> (weak reference, its file as shown or None if skipped, whether the file is in an installed package,
        #     {instruction offset of a frame that is a site: "path:line"}). Working out a frame's line number scans
        #     its code's line table, which is long for a long training loop.
        self._names: dict[int, tuple[weakref.ref, str | None, bool, dict[int, str]]] = {}
        self._line_count = 0

    def _skipped(self, path: str) -> bool:
        if path.startswith(self._packages):
            return True
        return path.startswith(self._stdlib) and not path.startswith(self._site_packages)

    def _file(self, filename: str) -> tuple[str, bool, bool]:
        """(the file as shown, whether it is skipped, whether it is in an installed package), cached per file."""
        known = self._files.get(filename)
        if known is None:
            if filename.startswith("<"):  # <string>, <stdin> are the user's; <frozen importlib._bootstrap> is not
                known = (filename, filename.startswith("<frozen"), False)
            else:
                path = os.path.abspath(filename)
                known = (self._shown(path), self._skipped(path), path.startswith(self._site_packages))
            if len(self._files) < 100_000:
                self._files[filename] = known
        return known

    def _known(self, code: CodeType) -> tuple[weakref.ref | None, str | None, bool, dict[int, str]]:
        known = self._names.get(id(code))
        if known is None:
            shown, skipped, library = self._file(code.co_filename)
            unnamed: tuple[weakref.ref | None, str | None, bool, dict[int, str]] = (
                None,
                None if skipped else shown,
                library,
                {},
            )
            if len(self._names) >= MAX_CODES:
                return unnamed
            key = id(code)

            def forget(_: weakref.ref, key: int = key) -> None:
                self._forget(key)

            known = (weakref.ref(code, forget), *unnamed[1:])
            self._names[key] = known
        return known

    def _forget(self, key: int) -> None:
        known = self._names.pop(key, None)
        if known is not None:
            self._line_count -= len(known[3])

    def _shown(self, path: str) -> str:
        # An installed package is named from its root (transformers/masking_utils.py), even when the environment
        # lives under the working directory (a .venv in the repository).
        for directory in self._site_packages:
            if path.startswith(directory):
                return path[len(directory) :]
        if path.startswith(self._cwd):
            return path[len(self._cwd) :]
        for directory in self._roots:  # the longest sys.path entry holding it: the package's root
            if path.startswith(directory):
                return path[len(directory) :]
        return path

    def site(self, frame: FrameType | None) -> str:
        """``path:line`` of the innermost frame outside the skipped code, or ``unknown``."""
        names = self._names
        while frame is not None:
            code = frame.f_code
            known = names.get(id(code))
            name = (known or self._known(code))[1]
            if name is not None:
                location = known[3].get(frame.f_lasti) if known is not None else None
                if location is None:
                    location = f"{name}:{frame.f_lineno}"
                    if known is not None and self._line_count < MAX_LINES:  # only a code object in _names
                        known[3][frame.f_lasti] = location
                        self._line_count += 1
                return location
            frame = frame.f_back
        return UNKNOWN

    def frames(self, frame: FrameType | None, limit: int = MAX_FRAMES) -> list[str]:
        """The site and the frames above it, innermost first, for the detailed view: ``limit`` of them, and if they
        are all in installed packages (a cut inside transformers), the first frame outside one too: the line of the
        user's script that led there."""
        found: list[str] = []
        user_seen = False
        for _ in range(MAX_WALK):
            if frame is None or (len(found) >= limit and user_seen):
                break
            _, name, library, _ = self._known(frame.f_code)
            if name is not None and (len(found) < limit or not library):
                found.append(f"{frame.f_code.co_name} ({name}:{frame.f_lineno})")
                user_seen = user_seen or not library
            frame = frame.f_back
        return found
