"""Onward's PostgreSQL and Redis stores on servers that take TLS, as managed ones do.

The test PostgreSQL runs with ``ssl=on`` and lets the role of ``DATABASE_TLS_URL`` in over TLS
only (``sslmode=verify-full``, ``sslrootcert`` the test CA); the test Redis has a TLS port
(``REDIS_TLS_URL``, ``rediss://``), whose CA reaches redis-py as ``ssl_ca_certs`` in the URL.
Both certificates are signed by ``ONWARD_TEST_TLS_CA``. The frontier and lease contracts run
over TLS, and each TLS setting an operator gets wrong (the password, the CA, a plaintext client
at a TLS-only server) stops ``onward start`` with exit 2 and one line naming the setting,
before anything is written.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import asyncpg
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from support.pg import SchemaFactory, schema_factory
from support.processes import TESTS
from support.servers import KafkaServers

from onward._storage.urls import masked_url
from onward.errors import BackendUnavailableError, ConfigurationError
from onward.projections.base import FrontierStore
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.redis import RedisFrontierStore
from onward.runtime.leases import LeaseStore, RedisLeaseStore
from onward.testing import FrontierStoreConformance, LeaseStoreConformance
from onward.testing.eventlog import TENANT, new_run_id

SECURED = ("DATABASE_TLS_URL", "REDIS_TLS_URL", "ONWARD_TEST_TLS_CA")
PARTITIONS = 3
AGENT = ["--agent", "support.cli_agent:booker", "--provider", "support.cli_agent:booking_model"]
WRONG_PASSWORD = "not-the-tls-password"


@dataclass(frozen=True)
class SecuredServers:
    """The TLS endpoints `scripts/services.sh` starts, and the CA that signed them."""

    database_url: str
    redis_tls_url: str
    ca: str

    @property
    def redis_url(self) -> str:
        """``REDIS_TLS_URL`` with the test CA, as a deployment on a private CA writes it."""
        return with_ca(self.redis_tls_url, self.ca)

    @property
    def database_password(self) -> str:
        password = _dsn_password(self.database_url)
        assert password, "DATABASE_TLS_URL carries no password"
        return password


def with_ca(redis_url: str, ca: str) -> str:
    """``redis_url`` naming ``ca`` as the file of the CA that signs the server's certificate."""
    joiner = "&" if "?" in redis_url else "?"
    return f"{redis_url}{joiner}ssl_ca_certs={quote(ca, safe='/')}"


def _dsn_password(url: str) -> str:
    userinfo = url.split("//", 1)[1].rsplit("@", 1)[0]
    return userinfo.split(":", 1)[1] if ":" in userinfo else ""


@pytest.fixture(scope="session")
def secured() -> SecuredServers:
    """The secured servers; a missing variable is a failure, not a skip."""
    missing = [name for name in SECURED if not os.environ.get(name)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not set: the TLS servers are part of the test servers "
            '(eval "$(bash scripts/services.sh up)")'
        )
    return SecuredServers(*(os.environ[name] for name in SECURED))


@pytest.fixture(scope="module")
def foreign_ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA that signed nothing the test servers present."""
    where = tmp_path_factory.mktemp("foreign-ca")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=Not the Onward test CA"),
            *("-keyout", str(where / "ca.key"), "-out", str(where / "ca.pem")),
        ],
        check=True,
        capture_output=True,
    )
    return str(where / "ca.pem")


@pytest_asyncio.fixture
async def new_tls_schema(secured: SecuredServers) -> AsyncIterator[SchemaFactory]:
    """Fresh schemas made (and dropped) by the TLS-only role, over TLS."""
    async with schema_factory(secured.database_url) as new:
        yield new


class TestPostgresFrontierStoreOverTls(FrontierStoreConformance):
    """The frontier store's whole contract, on connections the server takes over TLS only."""

    new_schema: SchemaFactory
    database_url: str

    @pytest.fixture(autouse=True)
    def _schemas(self, secured: SecuredServers, new_tls_schema: SchemaFactory) -> None:
        self.database_url = secured.database_url
        self.new_schema = new_tls_schema

    async def open_store(self) -> FrontierStore:
        schema = await self.new_schema()
        return await PostgresFrontierStore.open(self.database_url, schema=schema)


async def test_the_stores_connections_are_encrypted(
    secured: SecuredServers, new_tls_schema: SchemaFactory
) -> None:
    schema = await new_tls_schema()
    async with PostgresFrontierStore(secured.database_url, schema=schema) as store:
        await store.positions("frontiers")
        conn = await asyncpg.connect(secured.database_url)
        try:
            rows = await conn.fetch(
                "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                "WHERE a.application_name = $1",
                f"onward:{schema}",
            )
        finally:
            await conn.close()
    assert rows, "the store has no connection on the server"
    assert all(row["ssl"] for row in rows)


class TestRedisLeaseStoreOverTls(LeaseStoreConformance):
    """The lease store's whole contract over ``rediss://``; a wiped store is this one with the
    run's keys deleted."""

    redis_url: str
    prefix: str
    client: aioredis.Redis

    @pytest_asyncio.fixture(autouse=True)
    async def _server(self, secured: SecuredServers) -> AsyncIterator[None]:
        self.redis_url = secured.redis_url
        self.prefix = f"onward-test-{uuid.uuid4().hex}:"
        self.client = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            yield
            keys = [key async for key in self.client.scan_iter(match=f"{self.prefix}*")]
            if keys:
                await self.client.delete(*keys)
        finally:
            await self.client.aclose()

    async def open_store(self) -> LeaseStore:
        return await RedisLeaseStore.open(self.redis_url, prefix=self.prefix)

    async def wiped(self, store: LeaseStore, run_id: str) -> LeaseStore:
        assert isinstance(store, RedisLeaseStore)
        await self.client.delete(store.lease_key(run_id), store.fence_key(run_id))
        return store


class TestRedisFrontierStoreOverTls(FrontierStoreConformance):
    """The frontier store's whole contract over ``rediss://``."""

    redis_url: str
    prefixes: list[str]

    @pytest_asyncio.fixture(autouse=True)
    async def _server(self, secured: SecuredServers) -> AsyncIterator[None]:
        self.redis_url = secured.redis_url
        self.prefixes = []
        yield
        client = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            for prefix in self.prefixes:
                keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
                if keys:
                    await client.delete(*keys)
        finally:
            await client.aclose()

    async def open_store(self) -> FrontierStore:
        self.prefixes.append(f"onward-test-{uuid.uuid4().hex}:")
        return await RedisFrontierStore.open(self.redis_url, prefix=self.prefixes[-1])


async def test_a_lease_taken_over_tls_is_on_the_server(secured: SecuredServers) -> None:
    prefix = f"onward-test-{uuid.uuid4().hex}:"
    run_id = new_run_id()
    async with RedisLeaseStore(secured.redis_url, prefix=prefix) as store:
        lease = await store.acquire(run_id, tenant=TENANT, holder="w1", ttl_s=30)
        client = aioredis.Redis.from_url(secured.redis_url, decode_responses=True)
        try:
            assert await client.hget(store.lease_key(run_id), "holder") == "w1"
            await store.release(lease)
            await client.delete(store.fence_key(run_id))
        finally:
            await client.aclose()


def run_onward(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``onward *argv`` in ``env``, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "onward", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass(frozen=True)
class Deployment:
    """A deployment whose PostgreSQL and Redis take TLS (Kafka plain: its own tests secure it)."""

    env: dict[str, str]
    servers: KafkaServers

    def onward(self, *argv: str, **changes: str) -> subprocess.CompletedProcess[str]:
        return run_onward({**self.env, **changes}, *argv)

    async def ends(self) -> dict[int, int]:
        async with self.servers.log(partitions=PARTITIONS) as log:
            return {p: (await log.bounds(p)).end for p in range(PARTITIONS)}


@pytest_asyncio.fixture
async def deployment(
    secured: SecuredServers, kafka_servers: KafkaServers, new_tls_schema: SchemaFactory
) -> AsyncIterator[Deployment]:
    schema = await new_tls_schema()
    async with kafka_servers.log(partitions=PARTITIONS):
        pass  # the events topic exists, as in a deployment
    yield Deployment(
        {
            **os.environ,
            "PYTHONPATH": str(TESTS),
            **kafka_servers.env(partitions=PARTITIONS),
            "DATABASE_URL": secured.database_url,
            "ONWARD_DATABASE_SCHEMA": schema,
            "REDIS_URL": secured.redis_url,
        },
        kafka_servers,
    )


def _bad_settings(
    secured: SecuredServers, foreign_ca: str
) -> dict[str, tuple[str, str, list[str]]]:
    """Per case: the variable changed, its wrong value, and what the one line must name."""
    password = quote(secured.database_password, safe="")
    return {
        "postgres-wrong-password": (
            "DATABASE_URL",
            secured.database_url.replace(f":{password}@", f":{WRONG_PASSWORD}@", 1),
            ["DATABASE_URL", "password"],
        ),
        "postgres-unknown-ca": (
            "DATABASE_URL",
            secured.database_url.replace(secured.ca, foreign_ca),
            ["DATABASE_URL", "sslrootcert"],
        ),
        "postgres-plaintext": (
            "DATABASE_URL",
            secured.database_url.replace("sslmode=verify-full", "sslmode=disable"),
            ["DATABASE_URL", "sslmode"],
        ),
        "redis-unknown-ca": (
            "REDIS_URL",
            with_ca(secured.redis_tls_url, foreign_ca),
            ["REDIS_URL", "ssl_ca_certs"],
        ),
        "redis-plaintext": (
            "REDIS_URL",
            secured.redis_tls_url.replace("rediss://", "redis://", 1),
            ["REDIS_URL", "rediss://"],
        ),
    }


BAD_CASES = [
    "postgres-wrong-password",
    "postgres-unknown-ca",
    "postgres-plaintext",
    "redis-unknown-ca",
    "redis-plaintext",
]


@pytest.mark.kafka
async def test_a_run_starts_over_tls(deployment: Deployment) -> None:
    # What the bad settings below must not do: this command appends to the events topic.
    before = await deployment.ends()
    result = deployment.onward("start", "book 3A", "--tenant", "acme", *AGENT)
    assert result.returncode == 0, result.stderr
    assert sum((await deployment.ends()).values()) > sum(before.values())


@pytest.mark.parametrize("case", BAD_CASES)
@pytest.mark.kafka
async def test_a_wrong_tls_setting_is_named_in_one_line_and_nothing_is_written(
    deployment: Deployment, secured: SecuredServers, foreign_ca: str, case: str
) -> None:
    variable, value, named = _bad_settings(secured, foreign_ca)[case]
    assert value != deployment.env[variable]
    before = await deployment.ends()
    result = deployment.onward("start", "book 3A", "--tenant", "acme", *AGENT, **{variable: value})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in named:
        assert name in lines[0], lines[0]
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert secured.database_password not in output
    assert WRONG_PASSWORD not in output
    assert await deployment.ends() == before


async def test_migrate_refused_over_plaintext_creates_nothing(
    secured: SecuredServers, new_tls_schema: SchemaFactory
) -> None:
    schema = await new_tls_schema(migrated=False)
    plaintext = secured.database_url.replace("sslmode=verify-full", "sslmode=disable")
    env = {
        **os.environ,
        "ONWARD_BACKEND": "kafka",
        "DATABASE_URL": plaintext,
        "ONWARD_DATABASE_SCHEMA": schema,
    }
    result = run_onward(env, "db", "migrate")
    assert result.returncode == 2, result.stderr
    assert "sslmode" in result.stderr
    assert secured.database_password not in result.stdout + result.stderr
    conn = await asyncpg.connect(secured.database_url)
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1", schema
        )
    finally:
        await conn.close()
    assert tables == 0


UNUSABLE_CA = ["missing", "directory", "not-a-certificate"]


def unusable_ca(tmp_path: Path, case: str) -> Path:
    """A path given as a CA file that no CA can be loaded from."""
    not_a_certificate = tmp_path / "ca.pem"
    not_a_certificate.write_text("not a certificate\n")
    return {
        "missing": tmp_path / "no-such-ca.pem",
        "directory": tmp_path,
        "not-a-certificate": not_a_certificate,
    }[case]


@pytest.mark.parametrize("case", UNUSABLE_CA)
async def test_a_postgres_ca_file_that_cannot_be_read_is_named_not_taken_for_the_server(
    secured: SecuredServers, new_tls_schema: SchemaFactory, tmp_path: Path, case: str
) -> None:
    # The CA file is read before anything is sent: the server is up and would answer.
    unusable = unusable_ca(tmp_path, case)
    env = {
        **os.environ,
        "DATABASE_URL": secured.database_url.replace(secured.ca, str(unusable)),
        "ONWARD_DATABASE_SCHEMA": await new_tls_schema(migrated=False),
    }
    result = run_onward(env, "db", "migrate")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"sslrootcert in DATABASE_URL names {unusable}, which cannot be used" in line, line
    assert secured.database_password not in result.stdout + result.stderr


@pytest.mark.parametrize("case", UNUSABLE_CA)
async def test_a_redis_ca_file_that_cannot_be_read_is_named_not_taken_for_the_server(
    secured: SecuredServers, tmp_path: Path, case: str
) -> None:
    unusable = unusable_ca(tmp_path, case)
    with pytest.raises(ConfigurationError) as refused:
        await RedisLeaseStore.open(with_ca(secured.redis_tls_url, str(unusable)), timeout_s=5)
    assert f"ssl_ca_certs in REDIS_URL names {unusable}, which cannot be used" in str(refused.value)


async def test_a_tls_client_at_a_plaintext_redis_port_is_told_the_url_may_want_redis(
    secured: SecuredServers, redis_url: str
) -> None:
    """``rediss://`` at a port that takes no TLS: Redis waits for a command that never comes
    and the handshake never ends. The store said the server did not answer and to retry once
    it is reachable: it is, and no retry changes anything."""
    tls_at_plaintext = with_ca(redis_url.replace("redis://", "rediss://", 1), secured.ca)
    with pytest.raises(BackendUnavailableError) as failed:
        await RedisLeaseStore.open(tls_at_plaintext, timeout_s=1)
    assert "use redis:// in REDIS_URL" in str(failed.value)


NAME_UNCHECKED = "checked against the CA but not the server's name"
# Encrypted (or, with allow and prefer, maybe not) without checking who answers.
SERVER_UNCHECKED = (
    "certificate and name are not checked",
    "use sslmode=verify-full with sslrootcert",
)
# The chain checked, the name not: any server whose certificate the same CA signed (another
# tenant's, at a managed provider) is taken for the database. asyncpg takes verify_ca too.
CHAIN_ONLY = (NAME_UNCHECKED, "use sslmode=verify-full, which also checks the name")
UNCHECKED_POSTGRES = {
    "require": SERVER_UNCHECKED,
    "prefer": SERVER_UNCHECKED,
    "allow": SERVER_UNCHECKED,
    "verify-ca": CHAIN_ONLY,
    "verify_ca": CHAIN_ONLY,
}


@pytest.mark.parametrize("sslmode", list(UNCHECKED_POSTGRES))
async def test_a_postgres_url_that_leaves_the_server_unchecked_is_warned_about(
    secured: SecuredServers,
    new_tls_schema: SchemaFactory,
    caplog: pytest.LogCaptureFixture,
    sslmode: str,
) -> None:
    """An ``sslmode`` below ``verify-full`` leaves the server, or its name, unchecked, and the
    connection works as a checked one does, so nothing else would tell the operator: one
    warning per URL and process names the setting, what is not checked and the remedy, never
    the password. verify-full itself is not warned about."""
    not_checked, remedy = UNCHECKED_POSTGRES[sslmode]
    schema = await new_tls_schema()
    caplog.set_level(logging.WARNING, logger="onward.storage")
    async with PostgresFrontierStore(secured.database_url, schema=schema) as store:
        await store.positions("frontiers")
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    unchecked = secured.database_url.replace("sslmode=verify-full", f"sslmode={sslmode}")
    for _ in range(2):
        async with PostgresFrontierStore(unchecked, schema=schema) as store:
            await store.positions("frontiers")
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"DATABASE_URL {masked_url(unchecked)} has sslmode={sslmode}" in warning, warning
    assert not_checked in warning, warning
    assert remedy in warning, warning
    assert secured.database_password not in warning


UNCHECKED_REDIS = {
    "cert-reqs-none": (
        "ssl_cert_reqs=none",
        "has ssl_cert_reqs=none: the server's certificate is not checked",
    ),
    "hostname-unchecked": (
        "ssl_check_hostname=False",
        f"has ssl_check_hostname=False: the server's certificate is {NAME_UNCHECKED}",
    ),
    # redis-py takes the first of a repeated parameter (asyncpg the last): the certificate
    # goes unchecked, yet the warning read the last value and said nothing.
    "cert-reqs-twice": (
        "ssl_cert_reqs=none&ssl_cert_reqs=required",
        "has ssl_cert_reqs=none: the server's certificate is not checked",
    ),
}


@pytest.mark.parametrize("case", list(UNCHECKED_REDIS))
async def test_a_redis_url_that_leaves_the_server_unchecked_is_warned_about(
    secured: SecuredServers, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """``rediss://`` with the certificate or the host name unchecked connects as well as a
    checked one: one warning names the parameter, as redis-py takes it, that turned the check
    off, and says what is left unchecked (with the name alone unchecked, naming the CA is no
    remedy)."""
    parameters, says = UNCHECKED_REDIS[case]
    caplog.set_level(logging.WARNING, logger="onward.storage")
    store = await RedisLeaseStore.open(secured.redis_url, timeout_s=5)
    await store.close()
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    store = await RedisLeaseStore.open(f"{secured.redis_url}&{parameters}", timeout_s=5)
    await store.close()
    [warning] = [r.getMessage() for r in caplog.records]
    assert says in warning, warning
    assert "REDIS_URL" in warning, warning


async def test_a_redis_url_with_ssl_cert_reqs_optional_is_checked_and_not_warned_about(
    secured: SecuredServers, foreign_ca: str, caplog: pytest.LogCaptureFixture
) -> None:
    """For a client, ``ssl_cert_reqs=optional`` checks the server's certificate as
    ``required`` does (a certificate the named CA did not sign is refused): it was warned
    about as leaving the server unchecked, telling the operator to drop a setting that is
    safe."""
    caplog.set_level(logging.WARNING, logger="onward.storage")
    store = await RedisLeaseStore.open(f"{secured.redis_url}&ssl_cert_reqs=optional", timeout_s=5)
    await store.close()
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    with pytest.raises(ConfigurationError):
        await RedisLeaseStore.open(
            f"{with_ca(secured.redis_tls_url, foreign_ca)}&ssl_cert_reqs=optional", timeout_s=5
        )


async def test_a_redis_url_with_a_tls_value_redis_py_refuses_is_a_configuration_error(
    secured: SecuredServers,
) -> None:
    """redis-py refuses an ``ssl_cert_reqs`` it does not know (its values are lower case)
    with its own error when the store is built: it was raised as it came, untranslated, where
    every other unusable URL is a `ConfigurationError` naming ``REDIS_URL``."""
    with pytest.raises(ConfigurationError) as refused:
        await RedisLeaseStore.open(f"{secured.redis_url}&ssl_cert_reqs=OPTIONAL", timeout_s=5)
    assert "REDIS_URL" in str(refused.value)
    assert "OPTIONAL" in str(refused.value)


UNUSABLE_CLIENT_CERTIFICATE = ["certificate-not-pem", "key-not-pem", "key-of-another-certificate"]


@pytest.fixture(scope="module")
def client_certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two client certificates with their keys (``a.pem``/``a.key``, ``b.pem``/``b.key``),
    and a file that is no PEM at all (``not-pem``)."""
    where = tmp_path_factory.mktemp("client-certificates")
    for name in ("a", "b"):
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-subj", f"/CN=client {name}"),
                *("-keyout", str(where / f"{name}.key"), "-out", str(where / f"{name}.pem")),
            ],
            check=True,
            capture_output=True,
        )
    (where / "not-pem").write_text("not a certificate, nor a key\n")
    return where


def unusable_client_certificate(where: Path, case: str) -> tuple[Path, Path, Path, str]:
    """A client certificate and key that cannot be loaded together: the certificate, the key,
    the file at fault, and what the message says of it."""
    return {
        "certificate-not-pem": (
            where / "not-pem",
            where / "a.key",
            where / "not-pem",
            "it holds no PEM certificate",
        ),
        "key-not-pem": (where / "a.pem", where / "not-pem", where / "not-pem", "no PEM key"),
        "key-of-another-certificate": (
            where / "a.pem",
            where / "b.key",
            where / "b.key",
            f"it is not the key of the certificate {where / 'a.pem'}",
        ),
    }[case]


@pytest.mark.parametrize("case", UNUSABLE_CLIENT_CERTIFICATE)
async def test_a_postgres_client_certificate_that_cannot_be_loaded_is_named(
    secured: SecuredServers, new_tls_schema: SchemaFactory, client_certificates: Path, case: str
) -> None:
    certificate, key, at_fault, why = unusable_client_certificate(client_certificates, case)
    env = {
        **os.environ,
        "DATABASE_URL": f"{secured.database_url}&sslcert={certificate}&sslkey={key}",
        "ONWARD_DATABASE_SCHEMA": await new_tls_schema(migrated=False),
    }
    result = run_onward(env, "db", "migrate")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    setting = "sslcert" if at_fault == certificate else "sslkey"
    assert f"{setting} in DATABASE_URL names {at_fault}, which cannot be used: " in line, line
    assert why in line, line
    assert secured.database_password not in result.stdout + result.stderr


@pytest.mark.parametrize("case", UNUSABLE_CLIENT_CERTIFICATE)
async def test_a_redis_client_certificate_that_cannot_be_loaded_is_named(
    secured: SecuredServers, client_certificates: Path, case: str
) -> None:
    certificate, key, at_fault, why = unusable_client_certificate(client_certificates, case)
    url = f"{secured.redis_url}&ssl_certfile={certificate}&ssl_keyfile={key}"
    with pytest.raises(ConfigurationError) as refused:
        await RedisLeaseStore.open(url, timeout_s=5)
    setting = "ssl_certfile" if at_fault == certificate else "ssl_keyfile"
    assert f"{setting} in REDIS_URL names {at_fault}, which cannot be used: " in str(refused.value)
    assert why in str(refused.value)


async def test_a_usable_client_certificate_still_connects(
    secured: SecuredServers, new_tls_schema: SchemaFactory, client_certificates: Path
) -> None:
    # The servers ask for no client certificate: one that loads is sent or not, and the
    # stores connect as without it.
    pair = f"sslcert={client_certificates / 'a.pem'}&sslkey={client_certificates / 'a.key'}"
    schema = await new_tls_schema()
    async with PostgresFrontierStore(f"{secured.database_url}&{pair}", schema=schema) as store:
        await store.positions("frontiers")
    redis_pair = (
        f"ssl_certfile={client_certificates / 'a.pem'}&ssl_keyfile={client_certificates / 'a.key'}"
    )
    leases = await RedisLeaseStore.open(f"{secured.redis_url}&{redis_pair}", timeout_s=5)
    await leases.close()
