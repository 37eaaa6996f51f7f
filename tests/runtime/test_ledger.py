"""`Ledger`: the tools' own record of side effects, read while other processes write it."""

from __future__ import annotations

from pathlib import Path

from onward.runtime.demo_ledger import Ledger


def test_a_line_still_being_written_is_not_on_record_yet(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.record("book", "k1", n=1)
    with ledger.path.open("a") as out:
        out.write('{"tool": "book", "key": "k2", "n"')  # another process, mid-write
    assert [e["key"] for e in ledger.entries()] == ["k1"]
    with ledger.path.open("a") as out:
        out.write(": 2}\n")
    assert [e["key"] for e in ledger.entries()] == ["k1", "k2"]
    assert ledger.count("book") == 2


def test_no_file_is_no_effects(tmp_path: Path) -> None:
    assert Ledger(tmp_path / "missing.jsonl").entries() == []
