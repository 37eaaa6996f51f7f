"""`one_line` and `described`: an error's message as one masked line, for log lines and for the
cause a run that gave up ends with."""

from __future__ import annotations

from onward.runtime.fleet.recovery import described, one_line

PASSWORD = "hunter2-very-secret"


def test_a_secret_cut_short_where_a_long_message_is_cut_is_not_shown() -> None:
    """The message is cut before it is masked (to bound the work) and its white space is then
    collapsed, so the cut could fall inside a URL between its password and its ``@`` (no longer
    a URL's password to any pattern) and bring it into the first few hundred characters."""
    message = "connecting failed:" + "\n    " * 230 + f" postgresql://app:{PASSWORD}@db/app"

    line = described(RuntimeError(message))

    assert line.startswith("RuntimeError: connecting failed:")
    assert PASSWORD[:6] not in line


def test_a_long_word_cut_is_kept_when_it_is_all_there_is() -> None:
    word = "x" * 5000

    assert one_line(word) == "x" * 299 + "…"


def test_a_secret_in_a_short_message_is_masked() -> None:
    assert one_line(f"dsn postgresql://app:{PASSWORD}@db/app") == (
        "dsn postgresql://app:[REDACTED]@db/app"
    )
