"""`RequestSenderConformance`: what every transport of the fleet's requests must do (the Kafka
topic, `Requests`; the PostgreSQL table, `PostgresRequests`).

Subclass it once per transport and implement :meth:`RequestSenderConformance.open_sender`,
which returns an open sender signing with the signer it is given, and
:meth:`RequestSenderConformance.delivered`, which reads back what a worker of that transport
would be handed, in the order it would take it. Needs pytest and pytest-asyncio
(``asyncio_mode = "auto"``).

A request is a command (an answer approves a payment), so a transport must hand a worker each
request once, with the run it names, its wire value and the signature made over that run and
value and the time it was signed (kept with it); a run's requests in the order they were
submitted; the values it carries masked, as the event log only ever holds them; and nothing of
a batch holding one request a worker would refuse.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import NamedTuple

import pytest
import pytest_asyncio

from onward.errors import InvalidInputError, OnwardError
from onward.runtime.fleet.requests import (
    AnswerRequest,
    CancelRun,
    Request,
    RequestSender,
    ResumeRun,
    StartRun,
    TagRun,
    decode_request,
)
from onward.runtime.signing import DEFAULT_MAX_AGE_S, SIGNATURE_HEADER, RequestSigner

MASKED_SHAPE = "sk-ant-conformance0123456789abcdef"
"""A value of the shape the default `Redactor` masks (an Anthropic API key)."""
KEY = "0123456789abcdef0123456789abcdef"
"""The request key the suite signs with."""


class Delivered(NamedTuple):
    """A request as a worker of the transport is handed it."""

    run_id: str
    value: bytes
    signature: bytes | None


class RequestSenderConformance:
    """The contract of a `RequestSender`. Subclass per transport; every test must pass unchanged.

    Attributes:
        exit_stack: Unwound after each test: ``open_sender`` may enter into it what its
            transport needs for the test (a topic, a schema).
    """

    exit_stack: AsyncExitStack

    async def open_sender(self, signer: RequestSigner | None) -> RequestSender:
        """An open sender on a transport of the test's own, signing with ``signer``; it is
        closed after the test (enter it into `exit_stack`)."""
        raise NotImplementedError

    async def closed_sender(self) -> RequestSender:
        """A sender of the transport that was never opened."""
        raise NotImplementedError

    async def delivered(self, count: int) -> list[Delivered]:
        """The first ``count`` requests a worker of the transport would be handed, in the
        order it would take them (waiting for them to arrive, within a few seconds)."""
        raise NotImplementedError

    @pytest_asyncio.fixture
    async def sender(self) -> AsyncIterator[RequestSender]:
        async with AsyncExitStack() as self.exit_stack:
            yield await self.open_sender(RequestSigner(KEY))

    async def _decoded(self, count: int) -> list[Request]:
        return [decode_request(d.value) for d in await self.delivered(count)]

    async def test_every_kind_of_request_arrives_once_as_it_was_sent(
        self, sender: RequestSender
    ) -> None:
        run = _run_id()
        sent: list[Request] = [
            StartRun(run_id=run, tenant="acme", agent="booker", input={"n": 1}),
            AnswerRequest(run_id=run, tenant="acme", request_id="q1", approve=True, by="ann"),
            TagRun(run_id=run, tenant="acme", label="checked", by="ann"),
            ResumeRun(run_id=run, tenant="acme"),
            CancelRun(run_id=run, tenant="acme", by="ann", why="done with it"),
        ]
        await sender.submit_many(sent)
        assert await self._decoded(len(sent)) == sent

    async def test_a_run_s_requests_arrive_in_the_order_submitted(
        self, sender: RequestSender
    ) -> None:
        runs = [_run_id() for _ in range(3)]
        for n in range(4):
            await sender.submit(*(TagRun(run_id=r, tenant="acme", label=f"t{n}") for r in runs))
        got = await self._decoded(12)
        for run in runs:
            labels = [r.label for r in got if isinstance(r, TagRun) and r.run_id == run]
            assert labels == ["t0", "t1", "t2", "t3"], run

    async def test_each_request_is_signed_over_its_run_and_value(
        self, sender: RequestSender
    ) -> None:
        run = _run_id()
        await sender.submit(StartRun(run_id=run, tenant="acme", agent="booker"))
        (got,) = await self.delivered(1)
        assert got.run_id == run
        assert got.signature is not None
        headers = [(SIGNATURE_HEADER, got.signature)]
        assert RequestSigner(KEY).refusal(run.encode(), got.value, headers) is None
        other = RequestSigner("f" * 32)
        assert other.refusal(run.encode(), got.value, headers) is not None
        # The time it was signed is kept with it: once it is too old, it is refused.
        later = RequestSigner(KEY, clock=lambda: time.time() + 2 * DEFAULT_MAX_AGE_S)
        assert "expired" in (later.refusal(run.encode(), got.value, headers) or "")

    async def test_values_a_request_carries_are_masked(self, sender: RequestSender) -> None:
        run = _run_id()
        await sender.submit(
            StartRun(run_id=run, tenant="acme", agent="booker", input={"note": MASKED_SHAPE}),
            AnswerRequest(
                run_id=run,
                tenant="acme",
                request_id="q1",
                approve=True,
                by="ann",
                value=MASKED_SHAPE,
            ),
        )
        for got in await self.delivered(2):
            assert MASKED_SHAPE.encode() not in got.value

    async def test_a_batch_holding_a_request_a_worker_would_refuse_sends_nothing(
        self, sender: RequestSender
    ) -> None:
        run = _run_id()
        with pytest.raises(InvalidInputError, match=r"TagRun\.label"):
            await sender.submit(
                StartRun(run_id=run, tenant="acme", agent="booker"),
                TagRun(run_id=run, tenant="acme", label=""),
            )
        with pytest.raises(InvalidInputError, match=r"StartRun\.input"):
            await sender.submit(StartRun(run_id=run, tenant="acme", agent="b", input=float("nan")))
        await sender.submit(ResumeRun(run_id=run, tenant="acme"))
        assert await self._decoded(1) == [ResumeRun(run_id=run, tenant="acme")]

    async def test_an_unopened_sender_says_so_and_sends_nothing(self) -> None:
        async with AsyncExitStack() as self.exit_stack:
            unopened = await self.closed_sender()
            with pytest.raises(OnwardError, match="not open"):
                await unopened.submit(ResumeRun(run_id=_run_id(), tenant="acme"))

    async def test_a_sender_without_a_signer_sends_unsigned(self) -> None:
        async with AsyncExitStack() as self.exit_stack:
            unsigned = await self.open_sender(None)
            run = _run_id()
            await unsigned.submit(ResumeRun(run_id=run, tenant="acme"))
            assert await self.delivered(1) == [
                Delivered(
                    run, b'{"type":"resume","run_id":"%s","tenant":"acme"}' % run.encode(), None
                )
            ]


def _run_id() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


__all__ = ["Delivered", "RequestSenderConformance"]
