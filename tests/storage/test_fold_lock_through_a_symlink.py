"""The fold lock of an SQLite file is one lock whatever path the file is opened through.

Two processes folding one database, one through a symbolic link to it (or to its directory),
must take turns: a lock file named from the path as given would be another file for each, and
their folds would store rows folded onto rows cached before the other's write.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from support.processes import spawn_support

from onward._storage import SqliteStore
from onward.errors import BackendUnavailableError


@asynccontextmanager
async def held_by_another_process(db: Path) -> AsyncIterator[None]:
    """A child process holding the fold lock of ``db`` (opened by its own path), stopped."""
    child = await spawn_support("lock_child", "sqlite", str(db), stdout=asyncio.subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.strip() == b"held", line
        child.send_signal(signal.SIGSTOP)
        yield
    finally:
        child.kill()
        await child.wait()


@pytest.mark.parametrize("through", ["file", "directory"])
async def test_a_file_opened_through_a_symlink_shares_its_fold_lock(
    tmp_path: Path, through: str
) -> None:
    real = tmp_path / "data"
    real.mkdir()
    db = real / "onward.db"
    if through == "file":
        linked = tmp_path / "linked.db"
        linked.symlink_to(db)
    else:
        (tmp_path / "linked").symlink_to(real, target_is_directory=True)
        linked = tmp_path / "linked" / "onward.db"
    async with SqliteStore(db):
        pass  # created and migrated
    async with SqliteStore(linked, lock_timeout_s=1) as store, held_by_another_process(db):
        with pytest.raises(BackendUnavailableError, match="was not free within 1 s"):
            async with store.exclusive("fold"):
                raise AssertionError("taken while another process holds the file's fold lock")
    # The lock file stays beside the database itself.
    assert sorted(p.name for p in real.glob("*.lock")) == ["onward.db.fold.lock"]
