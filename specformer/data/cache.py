"""Where prepared data lives, and how it is written without ever leaving half a file.

Everything derived from a corpus (trained tokenizers, token arrays) is keyed by a
content hash of its inputs, so a cache entry is either exactly right or absent:
changing a file, a tokenizer setting or the library version gives a new key.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

T = TypeVar("T")

__all__ = [
    "default_cache_dir",
    "resolve_cache_dir",
    "content_hash",
    "atomic_file",
    "is_stream",
    "atomic_write_bytes",
    "atomic_write_text",
    "cache_write_error",
    "locked",
    "made_once",
    "remove_temporaries",
]

# the name atomic_file gives the file it writes: ".<name>.<16 hex digits>.tmp", beside <name>
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}\.tmp")


def default_cache_dir() -> Path:
    """``$SPECFORMER_CACHE``, else ``$XDG_CACHE_HOME/specformer``, else ``~/.cache/specformer``."""
    env = os.environ.get("SPECFORMER_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specformer"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    path = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def content_hash(*parts: Any, chunks: Iterable[bytes] = ()) -> str:
    """A short sha256 hex digest of JSON-able ``parts`` followed by raw ``chunks``."""
    h = hashlib.sha256()
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    for chunk in chunks:
        h.update(len(chunk).to_bytes(8, "little"))
        h.update(chunk)
    return h.hexdigest()[:20]


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a device or a pipe (``/dev/null``, ``/dev/stdout``, a FIFO): written
    to as it is, never replaced by a file renamed over it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """A new file beside ``path`` to write to; when the block ends without an error it is
    fsynced and renamed over ``path`` (a reader sees the old file or the new one, never a
    torn one), otherwise removed. It gets the permissions a plain ``open`` gives (the
    umask applies), not ``mkstemp``'s owner-only 0600: a shared run folder or cache stays
    readable by the group. A device or a pipe (``/dev/null``, ``/dev/stdout``, a FIFO) is
    written as it is: there is no file to replace."""
    path = Path(path)
    if is_stream(path):  # renaming a file over /dev/null or a pipe would replace it (as root, it can)
        with open(path, "wb") as f:
            yield f
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")  # see _TEMPORARY
    try:
        # made inside the try: a Ctrl-C just after the file is made still removes it
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def locked(path: str | os.PathLike[str], *, shared: bool = False, wait: bool = True) -> Iterator[bool]:
    """A lock on ``path`` while the block runs: a file (made when missing), or a folder, which
    is locked as it is (no file is made in it). Exclusive, or ``shared`` with other shared
    holders; another process asking for a lock that conflicts waits, or with ``wait=False``
    does not get it. Yields whether it is held: False also where the file system cannot lock
    (some network file systems) or there is no ``fcntl`` (Windows), and the block then runs
    unlocked. The kernel releases the lock of a process that dies, however it dies."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    if Path(path).is_dir():
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            yield False
            return
    else:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB))
        except OSError:  # no locking here, or (without wait) held by another process
            held = False
        else:
            held = True
        yield held
    finally:
        os.close(fd)  # releases the lock


def remove_temporaries(folder: str | os.PathLike[str], name: str | None = None) -> int:
    """Remove the temporary files :func:`atomic_file` left in ``folder`` (of the file ``name``
    only, when given): those of a process killed while writing (SIGKILL, the OOM killer, a
    machine that went down), hidden and never read again. Other files, whatever their name,
    stay. Call it only where no live process can be writing one, under the lock its writers
    hold. Returns how many bytes it freed; a file that cannot be removed stays."""
    freed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or (name is not None and match["name"] != name) or not entry.is_file(follow_symlinks=False):
            continue
        try:
            size = entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
        except OSError:
            continue
        freed += size
    return freed


def made_once(lock: Path, read: Callable[[], T | None], make: Callable[[bool], T], *, what: str = "") -> T:
    """A cache entry: ``read()`` when it is there, else ``make(alone)`` under the file lock
    ``lock``. A process that waited for the lock reads what the holder made instead of
    making it again; ``alone`` is whether the lock is really held (see :func:`locked`).
    The wait is a step of data preparation (:mod:`specformer.data.progress`), ``waiting for
    another process preparing WHAT (it holds LOCK)``: the holder may take minutes, or be stopped
    (Ctrl-Z) and hold it until it goes on, and a run that said nothing looked hung."""
    from specformer.data import progress

    found = read()
    if found is not None:
        return found
    lock.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        alone = held.enter_context(locked(lock, wait=False))
        if not alone:  # another process holds it (or this file system cannot lock: no wait)
            held.close()
            with progress.step(f"waiting for another process preparing {what or 'this cache entry'} (it holds {lock})"):
                alone = held.enter_context(locked(lock))
        found = read()
        return found if found is not None else make(alone)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def cache_write_error(what: str, path: str | os.PathLike[str], exc: OSError) -> str:
    """The message for a cache entry that could not be written (a full disk, a read-only
    folder): :func:`atomic_file` left nothing behind, so it is said which setting to change."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return (
        f"training.cache_dir: cannot write {what} {path} ({exc.strerror or exc}); nothing was half-written: "
        + ("free space there, or set training.cache_dir (or $SPECFORMER_CACHE) to another folder" if full
           else "set training.cache_dir (or $SPECFORMER_CACHE) to a folder that can be written")
    )
