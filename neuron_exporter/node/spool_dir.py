"""The spool directory's trust: whether a directory is safe to write to or read from, and how a file in it is opened.

The directory must be a real directory, no more open than ``spool_mode`` allows, and, for a writer, its own (in the
shared sticky modes: its own or root's); for a reader, a trusted user's. Files are opened without following links or
blocking, and must be regular, at most a given size and (for a reader that says so) a trusted user's. A reader (the
daemon, a job's endpoint) builds its ``Spool`` once from the options and hands it to what reads, serves and tidies
the directory.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..config import SPOOL_MODES, Options, user_ids
from .spool_format import DEFAULT_SPOOL_MODE, RejectedFile

OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class SpoolDirError(OSError):
    """The spool directory is not safe to use; ``str()`` is one line saying why and what to do."""


def file_mode(spool_mode: str) -> int:
    return SPOOL_MODES[spool_mode][1]


def trusted_owners(users: str | None) -> frozenset[int]:
    """The uids a reader trusts to own the spool directory and the files in it: root, the reader's own user, and
    ``users`` (the ``spool_trusted_users`` option, checked when it was read)."""
    return frozenset({0, os.geteuid(), *user_ids(users)})


def file_trust(spool_mode: str, trusted: frozenset[int]) -> frozenset[int] | None:
    """Whose files a reader serves: the trusted users', or, in the shared sticky modes, any user's (what those modes
    are for; the directory's mode already says who may write there)."""
    return None if SPOOL_MODES[spool_mode][0] & stat.S_ISVTX else trusted


def check_spool_dir(
    spool_dir, spool_mode: str = DEFAULT_SPOOL_MODE, writer: bool = True, trusted: frozenset[int] | None = None
) -> None:
    """Raise ``SpoolDirError`` unless ``spool_dir`` is a real directory that nobody beyond ``spool_mode`` can write
    to. A writer also needs it to be its own (or, for the shared sticky modes, root's): a directory that another
    user made could hold links and files laid for the writer to trip on. A reader given ``trusted`` needs it to
    belong to one of those uids: another user could have made it first and filled it with forged ranks."""
    mode = SPOOL_MODES[spool_mode][0]
    try:
        info = os.lstat(spool_dir)
    except OSError as error:
        raise SpoolDirError(error.errno, f"spool directory {spool_dir}: {error.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise SpoolDirError(errno.ELOOP, f"spool directory {spool_dir} is a symbolic link; give the real path")
    if not stat.S_ISDIR(info.st_mode):
        raise SpoolDirError(errno.ENOTDIR, f"spool directory {spool_dir} is not a directory")
    actual = stat.S_IMODE(info.st_mode)
    opened = actual & 0o022 & ~mode
    if opened or (actual & 0o002 and not actual & stat.S_ISVTX):
        who = "everyone" if actual & 0o002 else "its group"
        raise SpoolDirError(
            errno.EPERM,
            f"spool directory {spool_dir} is writable by {who} (mode {actual:04o}; "
            f"spool_mode {spool_mode} allows {mode:04o}): fix its mode or set spool_mode",
        )
    uid = os.geteuid()
    if not writer and trusted is not None and info.st_uid not in trusted:
        raise SpoolDirError(
            errno.EPERM,
            f"spool directory {spool_dir} belongs to uid {info.st_uid}, whom this reader "
            f"does not trust (root, uid {uid} and spool_trusted_users): set "
            "spool_trusted_users to the user whose jobs write there, or use another "
            "directory",
        )
    if writer and info.st_uid != uid and not (mode & stat.S_ISVTX and info.st_uid == 0):
        raise SpoolDirError(
            errno.EPERM,
            f"spool directory {spool_dir} belongs to uid {info.st_uid}, not to this "
            f"user (uid {uid}); use a directory of your own (spool_dir)",
        )


def prepare_spool_dir(spool_dir, spool_mode: str = DEFAULT_SPOOL_MODE) -> None:
    """A writer's: create the spool directory (again, if it was deleted) with ``spool_mode``, then check it."""
    path = Path(spool_dir)
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, SPOOL_MODES[spool_mode][0])  # mkdir's mode passes through the umask
        except FileExistsError:
            pass
    check_spool_dir(path, spool_mode, writer=True)


@dataclass(frozen=True)
class Spool:
    """The spool directory as a reader sees it: where it is, how open it may be (``spool_mode``), and whom the reader
    trusts to own it (root, this user and ``spool_trusted_users``, whose files are also read first)."""

    directory: Path
    mode: str = DEFAULT_SPOOL_MODE
    trusted: frozenset[int] = field(default_factory=lambda: trusted_owners(None))

    def __post_init__(self):
        object.__setattr__(self, "directory", Path(self.directory))

    @classmethod
    def of(cls, options: Options) -> Spool:
        return cls(Path(options.spool_dir), options.spool_mode, trusted_owners(options.spool_trusted_users))

    @property
    def file_owners(self) -> frozenset[int] | None:
        """Whose files are served (``file_trust``): None for anyone's."""
        return file_trust(self.mode, self.trusted)

    def check(self) -> None:
        """``SpoolDirError`` unless the directory is safe to read (``check_spool_dir``)."""
        check_spool_dir(self.directory, self.mode, writer=False, trusted=self.trusted)

    def prepare(self) -> None:
        """In a shared mode, create the directory if it is missing (the ranks of several users write there; in the
        other modes a rank creates its own); then, if it exists, check it. ``OSError`` says why it is unsafe."""
        if SPOOL_MODES[self.mode][0] & stat.S_ISVTX and not os.path.lexists(self.directory):
            prepare_spool_dir(self.directory, self.mode)
        if os.path.lexists(self.directory):
            self.check()


def open_regular(path: Path, max_bytes: int, trusted: frozenset[int] | None = None) -> tuple[int, os.stat_result]:
    """An fd of ``path`` opened read-only without following a link or blocking on a FIFO, if it is a regular file
    of at most ``max_bytes`` (owned by one of ``trusted``, if given); ``RejectedFile`` otherwise, ``OSError`` if it
    cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise RejectedFile("not_regular", "a symbolic link") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise RejectedFile("not_regular", "not a regular file")
    if trusted is not None and info.st_uid not in trusted:
        os.close(fd)
        raise RejectedFile("untrusted_owner", f"owned by uid {info.st_uid}, whom the reader does not trust")
    if info.st_size > max_bytes:
        os.close(fd)
        raise RejectedFile("too_large", f"{info.st_size} bytes, more than the {max_bytes} allowed")
    return fd, info


def file_identity(info: os.stat_result) -> tuple[int, int, int, int]:
    """What changes whenever a file is replaced or rewritten (a rank replaces its file by a rename)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns
