"""`RedisLeaseStore`: the conformance suite, plus the keys it leaves behind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis import Redis as SyncRedis
from redis.commands.core import AsyncScript
from support.private_servers import PrivateRedis, running
from support.proxy import TcpProxy, through, upstream

import onward._storage.redis as redis_storage
from onward.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
    ResumeConflictError,
)
from onward.runtime.leases import Leaseholder, LeaseStore, RedisLeaseStore, RunLease
from onward.runtime.leases.presence import default_holder
from onward.runtime.leases.redis import CLEANUP_GRACE_MS
from onward.testing import LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id
from onward.testing.leases import policy


@pytest_asyncio.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client, to look at and tamper with the keys behind a store's back."""
    plain = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield plain
    finally:
        await plain.aclose()


@pytest_asyncio.fixture
async def prefix(client: aioredis.Redis) -> AsyncIterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    chosen = f"onward-test-{uuid.uuid4().hex}:"
    yield chosen
    keys = [key async for key in client.scan_iter(match=f"{chosen}*")]
    if keys:
        await client.delete(*keys)


@pytest_asyncio.fixture
async def store(redis_url: str, prefix: str) -> AsyncIterator[RedisLeaseStore]:
    async with RedisLeaseStore(redis_url, prefix=prefix) as opened:
        yield opened


class TestRedisLeaseStore(LeaseStoreConformance):
    """A wiped store is this one with the run's keys deleted, as a restart without AOF does."""

    redis_url: str
    prefix: str
    client: aioredis.Redis

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str, prefix: str, client: aioredis.Redis) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.client = client

    async def open_store(self) -> LeaseStore:
        return await RedisLeaseStore.open(self.redis_url, prefix=self.prefix)

    async def wiped(self, store: LeaseStore, run_id: str) -> LeaseStore:
        assert isinstance(store, RedisLeaseStore)
        await self.client.delete(store.lease_key(run_id), store.fence_key(run_id))
        return store


async def test_the_fence_key_never_expires_and_the_lease_key_does(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    assert await client.pttl(store.fence_key(run_id)) == -1
    assert 30_000 < await client.pttl(store.lease_key(run_id)) <= 30_000 + CLEANUP_GRACE_MS
    stored = await client.hgetall(store.lease_key(run_id))
    assert stored["holder"] == "w1"
    assert stored["tenant"] == TENANT
    assert int(stored["fence"]) == lease.fence
    assert float(stored["expires_at"]) == lease.expires_at
    await store.release(lease)
    assert await client.exists(store.lease_key(run_id)) == 0
    assert await client.get(store.fence_key(run_id)) == str(lease.fence)


async def test_a_raised_fence_is_written_to_the_counter_and_the_hash(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    raised = await store.raise_fence(lease, above=2**40)
    assert raised.fence == 2**40 + 1
    assert await client.get(store.fence_key(run_id)) == str(raised.fence)
    assert await client.hget(store.lease_key(run_id), "fence") == str(raised.fence)
    assert await client.pttl(store.fence_key(run_id)) == -1


async def test_the_fence_outlives_the_cleanup_of_the_lease_hash(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    first = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    await client.delete(store.lease_key(run_id))  # as its PEXPIRE would
    await store.release(first)  # gone and never superseded: nothing to do
    second = await store.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=30)
    assert second.fence == first.fence + 1


async def test_an_unreachable_server_is_retryable() -> None:
    with pytest.raises(BackendUnavailableError) as failed:
        await RedisLeaseStore.open("redis://127.0.0.1:1/0")
    assert failed.value.retryable
    assert isinstance(failed.value.__cause__, redis_errors.ConnectionError)


async def test_a_url_that_is_not_redis_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        await RedisLeaseStore.open("http://127.0.0.1:6379")


async def test_a_url_parameter_redis_does_not_take_is_a_configuration_error(
    redis_url: str,
) -> None:
    """A TLS parameter on a ``redis://`` URL (the ``s`` forgotten), or a misspelt one: the
    operator is told which, not shown the driver's ``TypeError``."""
    for parameter in ("ssl_ca_certs=/etc/ca.pem", "socket_timout=5"):
        with pytest.raises(ConfigurationError, match=parameter.split("=")[0]) as refused:
            await RedisLeaseStore.open(f"{redis_url}?{parameter}")
        assert "REDIS_URL" in str(refused.value)


async def test_a_database_the_server_does_not_have_is_a_setting_to_fix(redis_url: str) -> None:
    """Redis has 16 databases unless configured otherwise: ``/99`` failed as a `BackendError`
    (exit 5, which a supervisor retries for ever) naming neither REDIS_URL nor what to do."""
    missing = urlunsplit(urlsplit(redis_url)._replace(path="/99"))
    with pytest.raises(ConfigurationError) as refused:
        await RedisLeaseStore.open(missing)
    assert "DB index is out of range" in str(refused.value)
    assert "REDIS_URL names a database the server does not have" in str(refused.value)
    assert not refused.value.retryable


GUARD_PASSWORD = "the-guarded-password"
PING_ONLY_PASSWORD = "the-ping-only-password"


@pytest.fixture(scope="module")
def guarded_redis() -> Iterator[PrivateRedis]:
    """A private Redis that takes logins: the default user's password, and a user
    ``ping-only`` allowed to run nothing but PING (as an ACL missing Onward's commands)."""
    server = PrivateRedis("--requirepass", GUARD_PASSWORD)
    try:
        server.start()
        admin = SyncRedis(port=server.port, password=GUARD_PASSWORD)
        try:
            admin.acl_setuser(
                "ping-only", enabled=True, passwords=[f"+{PING_ONLY_PASSWORD}"],
                keys=["*"], commands=["+ping"],
            )  # fmt: skip
        finally:
            admin.close()
        yield server
    finally:
        server.close()


async def _open_and_acquire(url: str, prefix: str) -> None:
    """Open a lease store on ``url`` and take a lease: what a worker does first."""
    store = await RedisLeaseStore.open(url, prefix=prefix, timeout_s=5)
    try:
        await store.acquire(new_run_id(), tenant=TENANT, holder="w1", ttl_s=30)
    finally:
        await store.close()


REFUSED_LOGINS = {
    "wrong-password": ":not-the-password@",
    "no-password": "",
    "unknown-user": f"nobody:{GUARD_PASSWORD}@",
    "no-permission": f"ping-only:{PING_ONLY_PASSWORD}@",
}


@pytest.mark.parametrize("case", list(REFUSED_LOGINS))
async def test_a_login_or_command_redis_refuses_names_redis_url(
    guarded_redis: PrivateRedis, prefix: str, case: str
) -> None:
    """A wrong password, none where one is needed, an unknown user, or a user whose ACL lacks
    Onward's commands: each a `ConfigurationError` (exit 2), but saying only Redis's words
    ("invalid username-password pair", "no permissions to run the 'evalsha' command"), not
    which setting to change."""
    url = f"redis://{REFUSED_LOGINS[case]}127.0.0.1:{guarded_redis.port}/0"
    with pytest.raises(ConfigurationError) as refused:
        await _open_and_acquire(url, prefix)
    assert "REDIS_URL" in str(refused.value), refused.value
    assert not refused.value.retryable
    for password in (GUARD_PASSWORD, PING_ONLY_PASSWORD):
        assert password not in str(refused.value)


CLUSTER_NODES = {
    # case: (the database in REDIS_URL, whether the node serves every hash slot)
    "database-other-than-0": (3, False),
    "slots-not-served": (0, False),
    "keys-in-several-slots": (0, True),
}


@pytest.mark.parametrize("case", list(CLUSTER_NODES))
async def test_a_redis_cluster_node_is_refused_as_a_setting_to_fix(prefix: str, case: str) -> None:
    """Onward needs a single Redis node (a script touches several runs' keys at once). A
    Cluster node refused SELECT or answered CLUSTERDOWN as a `BackendError` or a
    `BackendUnavailableError` (exit 5: a supervisor retried for ever), and CROSSSLOT named
    no setting."""
    database, serving = CLUSTER_NODES[case]
    async with running(PrivateRedis("--cluster-enabled", "yes")) as node:
        if serving:
            admin = aioredis.Redis(port=node.port)
            try:
                await admin.cluster("ADDSLOTSRANGE", 0, 16383)
            finally:
                await admin.aclose()
        with pytest.raises(ConfigurationError) as refused:
            await _open_and_acquire(f"redis://127.0.0.1:{node.port}/{database}", prefix)
    assert "a single Redis node (not Redis Cluster) in REDIS_URL" in str(refused.value)


async def test_a_command_the_server_does_not_take_is_a_setting_to_fix(prefix: str) -> None:
    """A server with Onward's commands disabled (``rename-command``) or a Redis-compatible
    one without them answers "unknown command": a `BackendError`, exit 5, retried for ever."""
    async with running(PrivateRedis("--rename-command", "EVALSHA", "")) as server:
        store = await RedisLeaseStore.open(server.url, prefix=prefix, timeout_s=5)
        try:
            with pytest.raises(ConfigurationError) as refused:
                await store.acquire(new_run_id(), tenant=TENANT, holder="w1", ttl_s=30)
        finally:
            await store.close()
    assert "unknown command 'EVALSHA'" in str(refused.value)
    assert "point REDIS_URL at a Redis that takes it" in str(refused.value)


async def test_a_server_error_becomes_a_backend_error(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    run_id = new_run_id()
    await client.set(store.lease_key(run_id), "not a hash")
    with pytest.raises(BackendError) as failed:
        await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    assert not isinstance(failed.value, BackendUnavailableError)
    assert isinstance(failed.value.__cause__, redis_errors.ResponseError)


async def test_a_key_of_another_type_is_named(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    """A key some other program (or deployment under the same prefix) wrote in another type
    failed with Redis's WRONGTYPE, naming the script and its line but not the key, so the
    operator could not tell which key clashes."""
    run_id = new_run_id()
    await client.rpush(store.fence_key(run_id), "a list")
    with pytest.raises(BackendError, match="WRONGTYPE") as failed:
        await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    assert store.fence_key(run_id) in str(failed.value)
    assert "ONWARD_REDIS_PREFIX" in str(failed.value)
    assert isinstance(failed.value.__cause__, redis_errors.ResponseError)


async def test_calls_made_together_go_to_redis_as_one_pipeline(
    store: RedisLeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's runs ask about their leases together; each asking alone cost the client
    a pooled connection, a timeout and a retry wrapper per call."""
    warm = await store.acquire(new_run_id(), tenant=TENANT, holder="w0", ttl_s=30)
    await store.current(warm.run_id)  # Redis knows both scripts from here on
    pipelines: list[object] = []
    real_pipeline = aioredis.Redis.pipeline

    def counted(self: aioredis.Redis, *args: object, **kwargs: object) -> object:
        pipelines.append(self)
        return real_pipeline(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(aioredis.Redis, "pipeline", counted)
    run_ids = [new_run_id() for _ in range(50)]
    leases = await asyncio.gather(
        *(store.acquire(r, tenant=TENANT, holder=f"w-{r}", ttl_s=30) for r in run_ids)
    )
    assert len(pipelines) == 1
    found = await asyncio.gather(*(store.current(r) for r in run_ids))
    assert len(pipelines) == 2
    assert [(f.run_id, f.holder, f.fence) for f in found if f] == [
        (lease.run_id, lease.holder, lease.fence) for lease in leases
    ]
    many = await store.current_many(run_ids)
    assert len(pipelines) == 3  # a page of runs read by `current_many` is one pipeline too
    assert {(f.run_id, f.holder, f.fence) for f in many.values()} == {
        (lease.run_id, lease.holder, lease.fence) for lease in leases
    }


async def test_a_redis_that_forgot_its_scripts_is_taught_them_again(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    held, other = new_run_id(), new_run_id()
    lease = await store.acquire(held, tenant=TENANT, holder="w1", ttl_s=30)
    await client.script_flush()  # as a restart does
    renewed, taken, found = await asyncio.gather(
        store.renew(lease, ttl_s=30),
        store.acquire(other, tenant=TENANT, holder="w2", ttl_s=30),
        store.current(held),
    )
    assert renewed.fence == lease.fence
    assert renewed.expires_at >= lease.expires_at
    assert taken.holder == "w2"
    assert found is not None
    assert found.holder == "w1"


async def test_calls_sent_together_run_in_the_order_made_after_a_restart(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    """After a restart another process taught Redis one script again but not the other: a
    release and the acquisition made after it, sent together, still run in that order, so the
    acquisition finds the run free instead of meeting the lease already handed back."""
    run_id = new_run_id()
    lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
    await client.script_flush()  # as a restart does
    await client.script_load(store._scripts["acquire"].script)  # another worker's call came first
    released, taken = await asyncio.gather(
        store.release(lease),
        store.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=30),
        return_exceptions=True,
    )
    assert released is None
    assert isinstance(taken, RunLease), taken
    assert taken.holder == "w2"
    assert taken.fence == lease.fence + 1


async def test_calls_that_ran_keep_their_answers_when_resending_flushed_ones_fails(
    redis_url: str, prefix: str, client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SCRIPT FLUSH lands inside a pipeline, after an acquisition ran and before a renewal
    sent with it: the renewal is sent again, and Redis goes away before it is. The acquisition
    took the run and must be told so; told it failed, its worker would hold nothing while the
    run stays held under its name (for a ttl, under a holder name of its own choosing)."""
    real = redis_storage._pipeline
    async with (
        TcpProxy(*upstream(redis_url)) as proxy,
        RedisLeaseStore(through(redis_url, proxy), prefix=prefix) as store,
    ):
        held, other = new_run_id(), new_run_id()
        lease = await store.acquire(held, tenant=TENANT, holder="w1", ttl_s=30)

        async def flushed_midway(to: aioredis.Redis, calls: list[Any]) -> list[Any]:
            monkeypatch.setattr(redis_storage, "_pipeline", real)
            ran = await real(to, calls[:1])
            await client.script_flush()  # as an operator's SCRIPT FLUSH does
            async with to.pipeline(transaction=False) as pipe:
                for call in calls[1:]:
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                rest = await pipe.execute(raise_on_error=False)
            await proxy.cut()  # Redis goes away before the flushed calls are sent again
            return [*ran, *rest]

        monkeypatch.setattr(redis_storage, "_pipeline", flushed_midway)
        taken, renewed = await asyncio.gather(
            store.acquire(other, tenant=TENANT, holder="w2", ttl_s=30),
            store.renew(lease, ttl_s=30),
            return_exceptions=True,
        )
        await proxy.restore()
    assert isinstance(renewed, BackendError), renewed
    assert await client.hget(f"{prefix}lease:{other}", "holder") == "w2"
    assert isinstance(taken, RunLease), f"the acquisition took the run yet was told: {taken!r}"
    assert taken.holder == "w2"


async def test_a_failing_call_does_not_fail_the_calls_sent_with_it(
    store: RedisLeaseStore, client: aioredis.Redis
) -> None:
    broken, fine = new_run_id(), new_run_id()
    await client.set(store.lease_key(broken), "not a hash")
    failed, taken = await asyncio.gather(
        store.acquire(broken, tenant=TENANT, holder="w1", ttl_s=30),
        store.acquire(fine, tenant=TENANT, holder="w1", ttl_s=30),
        return_exceptions=True,
    )
    assert isinstance(failed, BackendError), failed
    assert isinstance(failed.__cause__, redis_errors.ResponseError)
    assert isinstance(taken, RunLease)
    assert taken.run_id == fine


@pytest.mark.parametrize(("holder", "named"), [(None, "NoneType"), ("w\ud800", "surrogate")])
async def test_a_call_with_a_value_redis_cannot_take_fails_alone(
    store: RedisLeaseStore, client: aioredis.Redis, holder: Any, named: str
) -> None:
    """redis-py encodes a whole pipeline at once: a value it cannot encode (``None`` for a
    holder, a lone surrogate) failed every call sent with it, another run's renewal included,
    whose worker would then believe it lost its lease. Only the call holding the value fails,
    and its error names it. (A cancel ask's ``why`` is refused before any store is asked.)"""
    held, taken = new_run_id(), new_run_id()
    lease = await store.acquire(held, tenant=TENANT, holder="w1", ttl_s=30)
    renewed, refused = await asyncio.gather(
        store.renew(lease, ttl_s=30),
        store.acquire(taken, tenant=TENANT, holder=holder, ttl_s=30),
        return_exceptions=True,
    )
    assert isinstance(renewed, RunLease), f"another caller's bad value failed it: {renewed!r}"
    assert renewed.fence == lease.fence
    assert isinstance(refused, InvalidInputError), refused
    assert named in str(refused)
    assert "acquire" in str(refused)
    assert not await client.exists(store.lease_key(taken), store.fence_key(taken))


async def test_calls_still_queued_when_the_store_closes_fail_rather_than_hang(
    redis_url: str, prefix: str
) -> None:
    store = await RedisLeaseStore.open(redis_url, prefix=prefix)
    calls = [asyncio.create_task(store.current(new_run_id())) for _ in range(5)]
    await asyncio.sleep(0)  # every call is queued; none is sent yet
    await store.close()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
    assert all(isinstance(o, InvalidInputError) for o in outcomes), outcomes


async def test_a_store_not_open_says_so(redis_url: str, prefix: str) -> None:
    """Never opened, or closed: a call says the store is not open and how to open it, as
    every other store does, not an attribute or key of its own internals that is missing."""
    store = RedisLeaseStore(redis_url, prefix=prefix)
    with pytest.raises(InvalidInputError, match="not open"):
        await store.acquire(new_run_id(), tenant=TENANT, holder="w1", ttl_s=30)
    await store.start()
    await store.close()
    with pytest.raises(InvalidInputError, match="not open"):
        await store.current(new_run_id())


async def test_a_holder_cut_off_from_a_silent_store_knows_it_lost_the_lease_before_another_takes_it(
    redis_url: str, prefix: str
) -> None:
    """A Redis that stops answering (a partition, a hung server): each renewal hangs until the
    store's own timeout. The holder must still count its lease lost by the time it may have
    lapsed, not a whole store timeout later, while another worker already holds the run."""
    ttl_s, store_timeout_s = 1.5, 6.0
    parts = urlsplit(redis_url)
    assert parts.hostname is not None
    assert parts.port is not None
    async with TcpProxy(parts.hostname, parts.port) as proxy:
        through = redis_url.replace(f"{parts.hostname}:{parts.port}", f"127.0.0.1:{proxy.port}")
        async with (
            RedisLeaseStore(through, prefix=prefix, timeout_s=store_timeout_s) as cut_off,
            RedisLeaseStore(redis_url, prefix=prefix) as other,
        ):
            run_id = new_run_id()
            held = Leaseholder(cut_off, run_id, tenant=TENANT, holder="w1", policy=policy(ttl_s))
            async with held:
                await proxy.cut(silent=True)
                try:
                    loop = asyncio.get_running_loop()
                    started = loop.time()
                    while True:
                        try:
                            taken = await other.acquire(
                                run_id, tenant=TENANT, holder="w2", ttl_s=30
                            )
                            break
                        except ResumeConflictError:  # still held: poll again
                            assert loop.time() - started < ttl_s + 5, "the lease never lapsed"
                            await asyncio.sleep(0.02)
                    assert held.lease.superseded_by(taken)
                    try:
                        await asyncio.wait_for(held.fenced.wait(), 0.25)
                    except TimeoutError:
                        pytest.fail(
                            f"w2 took the run {loop.time() - started:.2f} s after the cut, yet "
                            "w1's holder still does not know its lease is lost"
                        )
                finally:
                    await proxy.restore()


ANSWER_TIMEOUT_S = 0.3


class AnswersLate(RedisLeaseStore):
    """Redis runs the script named in ``late``, but its answer comes after the store's timeout
    (a latency spike), so the caller gets a `BackendError` for a script that did run."""

    late: str | None = None

    async def run_script(
        self, script: AsyncScript, keys: list[str], args: list[Any], **named: Any
    ) -> Any:
        answer = await super().run_script(script, keys, args, **named)
        if self.late is not None and script is self._scripts[self.late]:
            await asyncio.sleep(ANSWER_TIMEOUT_S * 3)
        return answer


async def test_an_acquisition_answered_too_late_leaves_the_run_free(
    redis_url: str, prefix: str
) -> None:
    """The holder is told the store failed, so it holds nothing: neither may anybody else."""
    async with AnswersLate(redis_url, prefix=prefix, timeout_s=ANSWER_TIMEOUT_S) as store:
        run_id = new_run_id()
        store.late = "acquire"
        with pytest.raises(BackendError):
            async with Leaseholder(
                store, run_id, tenant=TENANT, holder=default_holder(), policy=policy(60)
            ):
                pytest.fail("the block must not be entered")
        store.late = None
        left = await store.current(run_id)
        assert left is None, f"the failed acquisition left the run held by nobody: {left}"
        taken = await store.acquire(run_id, tenant=TENANT, holder="w2", ttl_s=60)
        assert taken.holder == "w2"


async def test_a_fence_raise_answered_too_late_is_kept(redis_url: str, prefix: str) -> None:
    """Redis raised the fence though its answer came too late: the holder goes on under the
    raised fence, and its release still hands the run back."""
    async with AnswersLate(redis_url, prefix=prefix, timeout_s=ANSWER_TIMEOUT_S) as store:
        run_id = new_run_id()
        async with Leaseholder(
            store, run_id, tenant=TENANT, holder="w1", policy=policy(60)
        ) as held:
            first = held.lease
            store.late = "raise_fence"
            raised = await held.raise_fence(first.fence + 10)
            store.late = None
            assert raised.fence > first.fence + 10
            assert held.lease == raised == await store.current(run_id)
            await held.confirm()
        left = await store.current(run_id)
        assert left is None, f"the block left the run held by nobody: {left}"


async def test_an_acquisition_answered_too_late_leaves_a_lease_held_under_its_name_alone(
    redis_url: str, prefix: str
) -> None:
    """The lease under the holder's name is not the failed acquisition's when another block of
    this process holds it, or when the name is a custom one another process may have too."""
    async with AnswersLate(redis_url, prefix=prefix, timeout_s=ANSWER_TIMEOUT_S) as store:
        here, custom = new_run_id(), new_run_id()
        elsewhere = await store.acquire(custom, tenant=TENANT, holder="w1", ttl_s=60)
        async with Leaseholder(
            store, here, tenant=TENANT, holder=default_holder(), policy=policy(60)
        ) as held:
            store.late = "acquire"
            for run_id, holder in ((here, default_holder()), (custom, "w1")):
                with pytest.raises(BackendError):
                    async with Leaseholder(
                        store, run_id, tenant=TENANT, holder=holder, policy=policy(60)
                    ):
                        pytest.fail("the block must not be entered")
            store.late = None
            assert await store.current(here) == held.lease
            assert await store.current(custom) == elsewhere
