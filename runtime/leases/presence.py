"""Which lease holders on this host are still alive, told by locks the kernel drops at death.

A killed process cannot hand its leases back, so its runs would stay held until the lease
lapses (five minutes by default). On the same host a process can do better than wait: before
it takes its first lease, a process holds an exclusive ``flock`` on a file named after its
holder name; the kernel lets go of that lock when the process ends, however it ends (SIGKILL
included). A process that finds a run held by a holder of its own host can try the holder's
lock: if the lock is free, the holder is gone for certain, so its lease is handed back and taken
at once (`acquire_run`). The fence still decides: the taker's acquisition raises it, so
anything written under the dead holder's lease is refused by every reader.

The lock never gives a false "gone". A process stopped by SIGSTOP, swapped out or in a long
garbage collection still holds its lock, so it is waited out as before. A holder whose lock file
is not here (another host, another user, a custom holder name, a directory that could not be
made) is taken as alive. Only holder names of the default form ``<host>-<pid>`` with this
host's name take part, so a name another host also uses never matches a local file.

The files live in ``$XDG_RUNTIME_DIR/onward-holders`` (else ``<tmp>/onward-holders-<uid>``), a
directory of this user's only (mode 0700); ``ONWARD_HOLDERS_DIR`` names another. A file whose
process is gone is removed by whoever proves it gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path

from onward.errors import FencedError, ResumeConflictError
from onward.runtime.observability.counts import COUNTS

from .base import LeaseStore, RunLease, unheard

logger = logging.getLogger(__name__)

HOLDERS_DIR_ENV = "ONWARD_HOLDERS_DIR"
"""Names the directory of holder lock files, in place of the per-user default."""

CLAIM_WAIT_S = 1.0
"""How long a claim waits for a probe that holds the file's lock for a moment to let go."""

_claimed: dict[str, int] = {}
_guard = threading.Lock()


def default_holder() -> str:
    """This process's holder name: its host and process id, the form presence works with."""
    return f"{socket.gethostname()}-{os.getpid()}"


def holders_dir() -> Path | None:
    """The directory of holder lock files, made if missing; ``None`` if it is not this user's
    alone (another user made it, or it is a link), so no lock there can be trusted."""
    named = os.environ.get(HOLDERS_DIR_ENV)
    if named:
        folder = Path(named)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "onward-holders"
    else:
        folder = Path(tempfile.gettempdir()) / f"onward-holders-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError as exc:
        _presence_off(folder, f"it cannot be made ({exc})", named=bool(named))
        return None
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
        or stat.S_IMODE(info.st_mode) & 0o077
    ):
        _presence_off(folder, "it is not a directory of this user's alone", named=bool(named))
        return None
    return folder


_said_off: set[Path] = set()
"""Named holder directories already warned about: once per process is enough."""
_said_guard = threading.Lock()
"""Apart from `_guard`, which `claim` holds while it asks for the directory."""


def _presence_off(folder: Path, why: str, *, named: bool) -> None:
    """Say that presence is off. A directory the user named in ``ONWARD_HOLDERS_DIR`` is a
    warning, once: without it a dead local holder's runs wait out their whole ttl, and the
    user asked for presence there. The default directory stays a debug line."""
    if not named:
        logger.debug("holder presence off: %s: %s", folder, why)
        return
    with _said_guard:
        if folder in _said_off:
            return
        _said_off.add(folder)
    logger.warning(
        "holder presence off: %s=%s cannot be used: %s; a local holder that dies keeps its "
        "runs until their lease lapses; name a directory of this user's alone (mode 0700)",
        HOLDERS_DIR_ENV,
        folder,
        why,
    )


def _local_pid(holder: str) -> int | None:
    """The process id in a holder name of this host's default form, else ``None``."""
    prefix = f"{socket.gethostname()}-"
    if not holder.startswith(prefix):
        return None
    digits = holder[len(prefix) :]
    if not digits.isdigit() or len(digits) > 10:
        return None
    return int(digits)


def is_this_process(holder: str) -> bool:
    """Whether ``holder`` is this process's own default name: a lease under it can be no other
    process's (a custom name may be, by mistake, another process's too)."""
    return _local_pid(holder) == os.getpid()


def _lock_path(folder: Path, pid: int) -> Path:
    return folder / f"{pid}.lock"


def claim(holder: str) -> bool:
    """Hold this process's presence lock for ``holder`` until the process ends.

    Only a holder name of this process's own default form is claimed; any other name (a
    custom worker name, another process's) is left alone. Claiming twice is a no-op.

    Returns:
        Whether ``holder`` is now shown alive by a lock this process holds.
    """
    if _local_pid(holder) != os.getpid():
        return False
    with _guard:
        if holder in _claimed:
            return True
        folder = holders_dir()
        if folder is None:
            return False
        fd = _lock_fresh_file(_lock_path(folder, os.getpid()))
        if fd is None:
            return False
        _claimed[holder] = fd
        return True


def _lock_fresh_file(path: Path) -> int | None:
    """Open (or make) ``path`` and hold its lock, making sure the locked file is still the one
    at ``path`` (a prober may have removed it between the open and the lock)."""
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            logger.debug("holder presence off: %s cannot be opened (%s)", path, exc)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() > deadline:
                logger.debug("holder presence off: %s is locked (%s)", path, exc)
                return None
            time.sleep(0.01)
            continue
        try:
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def is_gone(holder: str) -> bool:
    """Whether ``holder`` is a process of this host that has ended, for certain.

    True only when the holder's lock file is here and its lock is free; the file is then
    removed. Anything short of that (no such file, the lock held, a name of another form or
    host, this very process) is ``False``.
    """
    pid = _local_pid(holder)
    folder = None if pid is None or pid == os.getpid() else holders_dir()
    if pid is None or folder is None:
        return False
    path = _lock_path(folder, pid)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not _free_and_still_there(fd, path):
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def _free_and_still_there(fd: int, path: Path) -> bool:
    """Lock ``fd`` if nobody holds it, and check it is still the file at ``path``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except OSError:
        return False


async def acquire_run(
    store: LeaseStore, run_id: str, *, tenant: str, holder: str, ttl_s: float
) -> RunLease:
    """Take a run's lease, taking it at once from a holder of this host whose process is gone.

    The dead holder's lease is released by holder and fence (a later holder is never touched)
    and then acquired as usual, so the fence goes up and whatever the dead process wrote under
    its lease stays refused.

    Raises:
        ResumeConflictError: A live holder (or one that cannot be proved gone) has the run.
    """
    claim(holder)
    try:
        lease = await _acquire(store, run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)
    except ResumeConflictError as refused:
        if refused.holder is None or not is_gone(refused.holder):
            COUNTS.lease_conflicts += 1
            raise
        dead = await store.current(run_id)
        if dead is not None and dead.holder == refused.holder and dead.tenant == tenant:
            with contextlib.suppress(FencedError):
                await store.release(unheard(dead))
            logger.info(
                "run %r: took over the lease of %s (fence %d), whose process on this host is gone",
                run_id,
                dead.holder,
                dead.fence,
            )
        try:
            lease = await _acquire(store, run_id, tenant=tenant, holder=holder, ttl_s=ttl_s)
        except ResumeConflictError:
            COUNTS.lease_conflicts += 1
            raise
    COUNTS.lease_claims += 1
    return lease


_HANDING_BACK: set[asyncio.Task[None]] = set()
"""Releases of leases taken for cancelled acquisitions, kept referenced until they end."""


async def _acquire(
    store: LeaseStore, run_id: str, *, tenant: str, holder: str, ttl_s: float
) -> RunLease:
    """`LeaseStore.acquire`, whose lease is released in the background if the caller is
    cancelled before the answer.

    Cancelling the caller does not undo an acquisition the store may already be making (a
    Redis script sent, a SQLite commit under way, a PostgreSQL statement run): its lease,
    held by nobody, would keep the run from every worker for a whole ttl.
    """
    taking = asyncio.ensure_future(store.acquire(run_id, tenant=tenant, holder=holder, ttl_s=ttl_s))
    try:
        return await asyncio.shield(taking)
    except asyncio.CancelledError:
        taking.add_done_callback(lambda taken: _hand_back(store, taken))
        raise


def _hand_back(store: LeaseStore, taken: asyncio.Future[RunLease]) -> None:
    """Start releasing the lease ``taken`` was answered with, if it was taken at all."""
    if taken.cancelled() or taken.exception() is not None:
        return
    lease = taken.result()

    async def release() -> None:
        try:
            await store.release(unheard(lease))
        except Exception as exc:  # noqa: BLE001 - best effort: the lease lapses after its ttl
            logger.warning(
                "run %r: the lease taken for a cancelled acquisition was not released (%s); "
                "it lapses after its ttl",
                lease.run_id,
                exc,
            )

    task = asyncio.get_running_loop().create_task(release())
    _HANDING_BACK.add(task)
    task.add_done_callback(_HANDING_BACK.discard)
