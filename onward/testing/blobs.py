"""`BlobStoreConformance`: the behaviour every `BlobStore` backend must show.

Subclass it once per backend and implement :meth:`BlobStoreConformance.open_store`, which
returns an open store. Bodies are fresh per test and stored by content, so the store need not
be empty. Override :meth:`BlobStoreConformance.open_another` when a second store can be opened
over the same data, as another worker's or after a restart: the suite then checks that a body
put through one is read through the other. Needs pytest and pytest-asyncio
(``asyncio_mode = "auto"``).

The claim check (`ClaimCheck`) is a store's one user: it puts a body too large for one log
record and writes its reference to the log, and every worker that reads the run afterwards
fetches it back by that reference. So a store must give back exactly the bytes it was given,
whatever they are and however large, under the address `digest_of` names; must take the same
body again without complaint (two workers may move out the same result); and must say
`HistoryUnavailableError` for a reference it cannot resolve, never a driver's error.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import msgspec
import pytest
import pytest_asyncio

from onward.errors import HistoryUnavailableError
from onward.eventlog.events import ToolCompleted
from onward.eventlog.references import BLOB_REF, is_reference
from onward.runtime.blobs import DEFAULT_THRESHOLD, BlobStore, ClaimCheck, digest_of

from .eventlog import TENANT, new_run_id

LARGE_BODY_BYTES = 16 * DEFAULT_THRESHOLD
"""A body far over the size at which the claim check moves one out: a large tool result."""
CONCURRENT_PUTS = 8
"""How many puts of one body race in the idempotency test."""


def fresh_body(size: int = 1024) -> bytes:
    """``size`` bytes no other test stores (unless ``size`` is too small to be unique)."""
    marker = uuid.uuid4().bytes
    return (marker + os.urandom(max(size - len(marker), 0)))[:size]


def every_byte() -> bytes:
    """A body holding each of the 256 byte values, NUL and invalid UTF-8 among them, after a
    marker no other test stores: bodies are bytes, never text."""
    return uuid.uuid4().bytes + bytes(range(256)) + b"\x00\xff\xfe\x00"


class BlobStoreConformance:
    """The contract of `BlobStore`. Subclass per backend; every test must pass unchanged.

    Attributes:
        exit_stack: Unwound after each test, after the stores are closed: ``open_store`` may
            enter into it what its store needs for the test (a schema, a file).
    """

    exit_stack: AsyncExitStack

    async def open_store(self) -> BlobStore:
        """An open store (bodies are fresh per test, so it need not be empty)."""
        raise NotImplementedError

    async def open_another(self, store: BlobStore) -> BlobStore:
        """A second open store over ``store``'s data: another worker's, or the same file or
        database opened again after a restart.

        By default ``store`` itself, right for a store that lives in one process (memory);
        override it wherever bodies outlive a store object.
        """
        return store

    async def _opened(self, store: BlobStore) -> BlobStore:
        self.exit_stack.push_async_callback(store.close)
        return store

    @pytest_asyncio.fixture
    async def store(self) -> AsyncIterator[BlobStore]:
        async with AsyncExitStack() as self.exit_stack:
            yield await self._opened(await self.open_store())

    async def another(self, store: BlobStore) -> BlobStore:
        """`open_another`, closed after the test."""
        other = await self.open_another(store)
        return other if other is store else await self._opened(other)

    # -- what a body is ----------------------------------------------------------------------

    async def test_a_body_reads_back_byte_for_byte(self, store: BlobStore) -> None:
        body = every_byte()
        digest = await store.put(body)
        read = await store.get(digest)
        assert read == body
        assert type(read) is bytes

    async def test_the_reference_is_the_sha256_of_the_body(self, store: BlobStore) -> None:
        body = fresh_body()
        digest = await store.put(body)
        assert digest == digest_of(body) == "sha256:" + hashlib.sha256(body).hexdigest()

    async def test_bodies_one_byte_apart_are_two_bodies(self, store: BlobStore) -> None:
        body = fresh_body()
        other = body[:-1] + bytes([body[-1] ^ 1])
        first, second = await store.put(body), await store.put(other)
        assert first != second
        assert (await store.get(first), await store.get(second)) == (body, other)

    async def test_an_empty_body_is_a_body(self, store: BlobStore) -> None:
        digest = await store.put(b"")
        assert digest == digest_of(b"")
        assert await store.get(digest) == b""

    async def test_a_body_far_over_the_claim_check_threshold_reads_back(
        self, store: BlobStore
    ) -> None:
        body = fresh_body(LARGE_BODY_BYTES)
        digest = await store.put(body)
        assert await store.get(digest) == body

    # -- stored once, by content -------------------------------------------------------------

    async def test_putting_a_body_again_changes_nothing(self, store: BlobStore) -> None:
        body = fresh_body()
        digest = await store.put(body)
        assert await store.put(body) == digest
        assert await store.get(digest) == body

    async def test_racing_puts_of_one_body_all_succeed(self, store: BlobStore) -> None:
        body = fresh_body()
        other = await self.another(store)
        digests = await asyncio.gather(
            *((store, other)[i % 2].put(body) for i in range(CONCURRENT_PUTS))
        )
        assert set(digests) == {digest_of(body)}
        assert await store.get(digest_of(body)) == body

    async def test_a_body_put_by_one_store_is_read_by_another(self, store: BlobStore) -> None:
        body = fresh_body()
        digest = await store.put(body)
        other = await self.another(store)
        assert await other.get(digest) == body
        second = fresh_body()
        assert await store.get(await other.put(second)) == second

    # -- what is not there -------------------------------------------------------------------

    async def test_a_missing_body_is_history_unavailable(self, store: BlobStore) -> None:
        digest = digest_of(fresh_body())
        with pytest.raises(HistoryUnavailableError) as missing:
            await store.get(digest)
        assert digest in str(missing.value)
        assert not missing.value.retryable

    @pytest.mark.parametrize(
        "reference",
        [
            "",
            "sha256:",
            "sha256:not-hex",
            "md5:" + "0" * 32,
            "sha256:" + "f" * 4096,
            "sha256:\x00" + "0" * 63,
        ],
        ids=["empty", "no-digest", "not-hex", "another-hash", "too-long", "nul"],
    )
    async def test_a_reference_that_is_no_digest_is_missing_too(
        self, store: BlobStore, reference: str
    ) -> None:
        with pytest.raises(HistoryUnavailableError):
            await store.get(reference)

    async def test_a_body_stored_is_not_found_under_a_neighbours_digest(
        self, store: BlobStore
    ) -> None:
        digest = await store.put(fresh_body())
        neighbour = digest[:-1] + ("0" if digest[-1] != "0" else "1")
        with pytest.raises(HistoryUnavailableError):
            await store.get(neighbour)

    # -- under the claim check ---------------------------------------------------------------

    async def test_the_claim_check_moves_a_large_result_out_and_back(
        self, store: BlobStore
    ) -> None:
        result = {"rows": [fresh_body(64).hex() for _ in range(64)]}
        completed = ToolCompleted(
            run_id=new_run_id(), tenant=TENANT, seq=5, fence=1, call_id="c1", result=result
        )
        claim_check = ClaimCheck(store, threshold=1024)
        shrunk = await claim_check.shrink(completed)
        assert isinstance(shrunk, ToolCompleted)
        assert is_reference(shrunk.result)
        assert await store.get(shrunk.result[BLOB_REF]) == msgspec.json.encode(result)
        assert await claim_check.restore(shrunk) == completed

    async def test_the_claim_check_names_the_run_and_seq_of_a_missing_body(
        self, store: BlobStore
    ) -> None:
        run_id = new_run_id()
        with pytest.raises(HistoryUnavailableError) as missing:
            await ClaimCheck(store).body(digest_of(fresh_body()), run_id=run_id, seq=7)
        assert f"run {run_id!r} seq 7" in str(missing.value)
        assert missing.value.run_id == run_id

    @pytest.mark.parametrize("reference", [5, None, ["sha256:"], {"sha256": "0"}])
    async def test_a_reference_naming_no_string_is_missing_for_the_claim_check(
        self, store: BlobStore, reference: object
    ) -> None:
        """A record another writer made (or one damaged) may hold any JSON where the digest
        goes: the run's history has a hole there, never a driver's error about a type."""
        run_id = new_run_id()
        completed = ToolCompleted(
            run_id=run_id,
            tenant=TENANT,
            seq=5,
            fence=1,
            call_id="c1",
            result={BLOB_REF: reference, "size": 1},
        )
        with pytest.raises(HistoryUnavailableError) as missing:
            await ClaimCheck(store).restore(completed)
        assert f"run {run_id!r} seq 5" in str(missing.value)

    async def test_closing_twice_is_harmless(self, store: BlobStore) -> None:
        await store.close()
        await store.close()
