"""Training scripts forked from a server that has already imported torch and torch_xla.

Importing torch_xla costs a new interpreter about 4 s of CPU, most of what a short scenario script costs; the
suite starts well over a hundred of them. A forkserver (multiprocessing's) imports them once per test worker and
forks a process per script: the script runs as ``__main__`` with its own arguments, environment and standard
streams, from a process in which nothing has touched a device yet, as in a fresh interpreter after its imports.
What a fork cannot give is an environment read while torch_xla was imported: a run whose environment changes
those variables (or asks for autostart, which happens at interpreter start) gets a fresh interpreter instead.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Read when torch or torch_xla is imported, or when the interpreter starts: the server's values hold.
READ_AT_IMPORT = ("XLA_", "PT_XLA_", "PJRT_", "TORCH", "OMP_", "MKL_", "NEURON_EXPORTER_AUTO")
PRELOAD = [name for name in ("torch", "torch_xla") if importlib.util.find_spec(name) is not None]


def forkable(env: dict[str, str]) -> bool:
    """Whether a script with ``env`` runs the same forked from the server as in a fresh interpreter."""
    if not PRELOAD:
        return False
    names = {k for k in {*env, *os.environ} if k.startswith(READ_AT_IMPORT)}
    return all(env.get(name) == os.environ.get(name) for name in names)


_context = None


def context() -> multiprocessing.context.ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _run_script(script: str, args: list[str], env: dict[str, str], stdin: str, stdout: str, stderr: str) -> None:
    """In the forked process: the script as ``__main__``, as ``python script args`` would run it."""
    os.environ.clear()
    os.environ.update(env)
    # Standard output first: once the test can open standard input for writing, the script's output is open.
    os.dup2(os.open(stdout, os.O_WRONLY), 1)
    os.dup2(os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.dup2(os.open(stdin, os.O_RDONLY), 0)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        if isinstance(exit.code, str):
            print(exit.code, file=sys.stderr)
        code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit status 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # a forked process ends with os._exit, which runs none of them
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ForkedProcess:
    """The part of subprocess.Popen's interface that TrainingRun uses (text streams), for a forked script."""

    def __init__(self, script: Path, args: list[str], env: dict[str, str]):
        self._directory = tempfile.TemporaryDirectory(prefix="forked-")
        paths = {name: os.path.join(self._directory.name, name) for name in ("stdin", "stdout", "stderr")}
        os.mkfifo(paths["stdin"])
        os.mkfifo(paths["stdout"])
        # Opened before the script starts, so that its open for writing never waits.
        out = os.open(paths["stdout"], os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(out, True)
        self.stdout = open(out, encoding="utf-8")
        self._process = context().Process(
            target=_run_script, args=(str(script), args, env, paths["stdin"], paths["stdout"], paths["stderr"])
        )
        self._stderr_path = paths["stderr"]
        self._stderr_text: str | None = None
        self._process.start()
        self.pid = self._process.pid
        self.stdin = open(self._open_for_writing(paths["stdin"]), "w", encoding="utf-8")

    def _open_for_writing(self, fifo: str) -> int:
        while True:
            with contextlib.suppress(OSError):  # ENXIO until the script has opened its end
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.set_blocking(fd, True)
                return fd
            if not self._process.is_alive():
                raise RuntimeError(f"the forked script ended before reading its input: {self._read_stderr()}")
            time.sleep(0.01)

    def _read_stderr(self) -> str:
        if self._stderr_text is not None:  # the script has ended and its files are gone
            return self._stderr_text
        try:
            return Path(self._stderr_path).read_text(errors="replace")
        except OSError:
            return ""

    @property
    def stderr(self) -> io.StringIO:
        """What the script wrote to its standard error so far (a file, not a pipe)."""
        return io.StringIO(self._read_stderr())

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(str(self._process), timeout or 0)
        self._close()
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, input: str = "", timeout: float | None = None) -> tuple[str, str]:
        with contextlib.suppress(BrokenPipeError):
            self.stdin.write(input)
            self.stdin.close()
        rest = self.stdout.read()
        self.wait(timeout)
        return rest, self._read_stderr()

    def _close(self) -> None:
        if self._stderr_text is None:
            self._stderr_text = self._read_stderr()
            for stream in (self.stdin, self.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            self._directory.cleanup()
