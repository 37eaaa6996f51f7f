"""A run held by a process of this host that has ended is taken at once, never a live one's.

Each test starts a real child process that takes a run's lease as the runtime does and holds
it, then kills, stops or keeps it, and asks for the same run from this process. Run on every
store a fleet shares across processes: the SQLite file, PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from support.lease_child import HOLD_TTL_S, open_store
from support.pg import fresh_schema
from support.processes import spawn_support

from onward.errors import ResumeConflictError
from onward.runtime.leases import LeaseStore
from onward.runtime.leases.presence import (
    HOLDERS_DIR_ENV,
    acquire_run,
    claim,
    default_holder,
    holders_dir,
    is_gone,
)
from onward.testing.eventlog import TENANT, new_run_id

TAKEN_WITHIN_S = 2.0
"""The issue's bound: a dead local holder's run is taken this soon, not after its ttl."""

StoreAt = tuple[str, str]


@pytest.fixture(autouse=True)
def holders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's lock files in a directory of its own (children inherit the variable)."""
    folder = tmp_path / "holders"
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(folder))
    return folder


@pytest.fixture(params=["sqlite", "postgres", "redis"])
async def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreAt]:
    """Where a test and its child both find the leases: a file, a schema or a key prefix."""
    kind = request.param
    if kind == "sqlite":
        yield kind, str(tmp_path / "leases.db")
    elif kind == "postgres":
        database_url = request.getfixturevalue("database_url")
        async with fresh_schema(database_url) as schema:
            yield kind, f"{database_url}#{schema}"
    else:
        redis_url = request.getfixturevalue("redis_url")
        yield kind, f"{redis_url}#presence-{uuid.uuid4().hex}:"


@asynccontextmanager
async def holding_child(
    at: StoreAt, run_id: str, *holder: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, dict[str, object]]]:
    """A child process holding ``run_id``'s lease; killed on the way out if still running."""
    child = await spawn_support(
        "lease_child", *at, run_id, TENANT, *holder, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line, f"the lease child exited with {await child.wait()} before holding the run"
        yield child, json.loads(line)
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        await child.wait()


@asynccontextmanager
async def opened(at: StoreAt) -> AsyncIterator[LeaseStore]:
    async with AsyncExitStack() as stack:
        yield await stack.enter_async_context(await open_store(*at))


async def test_a_killed_holder_of_this_host_is_taken_over_at_once_with_a_higher_fence(
    store_at: StoreAt, holders: Path
) -> None:
    run_id = new_run_id()
    async with opened(store_at) as store, holding_child(store_at, run_id) as (child, held):
        assert held["holder"] == f"{socket.gethostname()}-{child.pid}"
        assert (holders / f"{child.pid}.lock").exists()
        child.kill()
        await child.wait()
        started = time.monotonic()
        lease = await acquire_run(
            store, run_id, tenant=TENANT, holder=default_holder(), ttl_s=HOLD_TTL_S
        )
        assert time.monotonic() - started < TAKEN_WITHIN_S
        assert lease.holder == default_holder()
        assert lease.fence > int(held["fence"])  # type: ignore[call-overload]
        assert not (holders / f"{child.pid}.lock").exists()


async def test_a_live_holder_is_refused_naming_when_its_lease_lapses(store_at: StoreAt) -> None:
    run_id = new_run_id()
    async with opened(store_at) as store, holding_child(store_at, run_id) as (_, held):
        with pytest.raises(ResumeConflictError) as refused:
            await acquire_run(
                store, run_id, tenant=TENANT, holder=default_holder(), ttl_s=HOLD_TTL_S
            )
        assert refused.value.holder == held["holder"]
        assert refused.value.expires_at is not None
        assert 0 < refused.value.expires_at - time.time() <= HOLD_TTL_S
        assert " until " in str(refused.value)
        assert (await store.current(run_id)) is not None


async def test_a_stopped_holder_still_holds_its_run(store_at: StoreAt) -> None:
    """SIGSTOP (or a long pause) leaves the process alive, and its lock with it: waited out."""
    run_id = new_run_id()
    async with opened(store_at) as store, holding_child(store_at, run_id) as (child, held):
        child.send_signal(signal.SIGSTOP)
        with pytest.raises(ResumeConflictError):
            await acquire_run(
                store, run_id, tenant=TENANT, holder=default_holder(), ttl_s=HOLD_TTL_S
            )
        current = await store.current(run_id)
        assert current is not None
        assert current.holder == held["holder"]


@pytest.mark.parametrize("name", ["custom-worker", "elsewhere-{pid}"])
async def test_a_dead_holder_of_another_name_or_host_is_waited_out(
    tmp_path: Path, name: str
) -> None:
    """A name that is not this host's default form cannot be proved gone: it keeps its lease."""
    at: StoreAt = ("sqlite", str(tmp_path / "leases.db"))
    run_id = new_run_id()
    async with opened(at) as store:
        async with holding_child(at, run_id, name.format(pid=os.getpid() + 1)) as (child, _):
            child.kill()
            await child.wait()
        with pytest.raises(ResumeConflictError) as refused:
            await acquire_run(
                store, run_id, tenant=TENANT, holder=default_holder(), ttl_s=HOLD_TTL_S
            )
        assert refused.value.expires_at is not None


async def test_a_dead_holder_is_not_taken_over_by_another_tenant(tmp_path: Path) -> None:
    at: StoreAt = ("sqlite", str(tmp_path / "leases.db"))
    run_id = new_run_id()
    async with opened(at) as store, holding_child(at, run_id) as (child, _):
        child.kill()
        await child.wait()
        with pytest.raises(ResumeConflictError) as refused:
            await acquire_run(
                store, run_id, tenant="other", holder=default_holder(), ttl_s=HOLD_TTL_S
            )
        assert refused.value.holder is None
        assert refused.value.expires_at is None


def test_presence_is_only_claimed_for_this_process_own_default_name() -> None:
    assert not claim("custom-worker")
    assert not claim(f"{socket.gethostname()}-{os.getpid() + 1}")
    assert claim(default_holder())
    assert not is_gone(default_holder())


def test_a_holders_directory_another_user_could_write_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(shared))
    assert holders_dir() is None
    assert not is_gone(f"{socket.gethostname()}-{os.getpid() + 1}")


@pytest.mark.parametrize("kind", ["a file", "shared"])
def test_a_named_holders_directory_that_cannot_be_used_is_warned_about_once(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Presence off is a dead local holder's runs waiting out their ttl: a directory the user
    named and that cannot be used is said at warning level, once per process, naming the
    variable; the claim still goes on without it."""
    named = tmp_path / kind.replace(" ", "-")
    if kind == "a file":
        named.write_text("")
    else:
        named.mkdir(mode=0o777)
        named.chmod(0o777)
    monkeypatch.setenv(HOLDERS_DIR_ENV, str(named))
    caplog.set_level("WARNING", logger="onward.runtime.leases.presence")
    assert holders_dir() is None
    assert holders_dir() is None
    assert not is_gone(f"{socket.gethostname()}-{os.getpid() + 1}")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned
    assert f"{HOLDERS_DIR_ENV}={named}" in warned[0]
    assert "until their lease lapses" in warned[0]


def test_the_default_holders_directory_that_cannot_be_used_is_not_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unnamed, the default place failing (a read-only temp) is a debug line: the user asked
    for nothing there."""
    runtime_dir = tmp_path / "runtime"
    runtime_dir.write_text("")  # not a directory: the default under it cannot be made
    monkeypatch.delenv(HOLDERS_DIR_ENV)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    caplog.set_level("DEBUG", logger="onward.runtime.leases.presence")
    assert holders_dir() is None
    levels = {r.levelname for r in caplog.records if "holder presence off" in r.getMessage()}
    assert levels == {"DEBUG"}
