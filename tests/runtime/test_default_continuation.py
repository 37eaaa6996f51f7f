"""`DEFAULT_CONTINUATION`: a continuation policy to start from, with the bounds it documents."""

from __future__ import annotations

import msgspec

from onward.runtime import DEFAULT_CONTINUATION
from onward.testing.frontiers import frontier


def test_the_default_continuation_is_a_policy_to_start_from() -> None:
    assert (DEFAULT_CONTINUATION.max_steps, DEFAULT_CONTINUATION.max_history_bytes) == (
        10_000,
        4_000_000,
    )
    run = frontier("r", through=10)
    assert not DEFAULT_CONTINUATION.due(msgspec.structs.replace(run, last_seq=9_999))
    assert DEFAULT_CONTINUATION.due(msgspec.structs.replace(run, last_seq=10_000))
    assert DEFAULT_CONTINUATION.due(run, history_bytes=4_000_000)
    assert not DEFAULT_CONTINUATION.due(run, history_bytes=3_999_999)
