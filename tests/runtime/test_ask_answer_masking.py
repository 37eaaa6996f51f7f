"""An answer that does not fit its question's schema is refused with the places it fails at,
each cut to 200 characters. The message reaches a fleet worker's log when the worker refuses
the answer (`Worker._refused`), so a secret in the answer is masked before the cut: cut first,
a URL cut between its password and its ``@`` is text no pattern knows any more."""

from __future__ import annotations

import json

import pytest

from onward.errors import InvalidInputError
from onward.runtime.ask import check_answer
from onward.runtime.fleet.recovery import one_line

PASSWORD = "s3cret-db-passw0rd"


def test_a_secret_in_a_refused_answer_cut_by_the_message_is_masked_not_logged_in_part() -> None:
    url = f"postgres://app:{PASSWORD}@db.internal/app"
    # The fault's message is the answer's repr (a quote first), then why: the cut at 200
    # falls in the middle of the password.
    lead = 200 - 1 - url.index(PASSWORD) - len(PASSWORD) // 2
    answer = "x" * lead + url
    with pytest.raises(InvalidInputError) as caught:
        check_answer(json.dumps({"type": "integer"}), answer, run_id="r", request_id="q")
    logged = one_line(str(caught.value))
    assert "postgres://app:" in logged
    assert PASSWORD[: len(PASSWORD) // 3] not in logged
    assert PASSWORD[: len(PASSWORD) // 3] not in str(caught.value)
