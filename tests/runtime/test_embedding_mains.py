"""`frontier_main` and `resume_main`: a product exposes ``inspect`` and ``run --resume`` on its
own stores (here SQLite files no ``ONWARD_*`` variable names), and a script reads the exit code."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import FrameType

import msgspec
import pytest
from support import cli_agent

from onward.eventlog import SqliteEventLog
from onward.projections.frontier import FRONTIER_FORMAT
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import AgentRunner, SqliteLeaseStore
from onward.runtime.cli import frontier_main, resume_main

TENANT = ["--tenant", "acme"]


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The mains never read the settings: these would point every store elsewhere.
    monkeypatch.setenv("ONWARD_BACKEND", "sqlite")
    monkeypatch.setenv("ONWARD_SQLITE_PATH", str(tmp_path / "not-the-products.db"))


def product(
    db: Path, worker: str = "oncall"
) -> Callable[[], AbstractAsyncContextManager[AgentRunner]]:
    """How the product opens its stores and gets a runner on them."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[AgentRunner]:
        async with (
            SqliteEventLog(db) as log,
            SqliteFrontierStore(db) as frontiers,
            SqliteLeaseStore(db) as leases,
        ):
            yield AgentRunner(
                provider=cli_agent.paying_model(),
                log=log,
                frontiers=frontiers,
                leases=leases,
                checkpoint_inline=True,
                worker=worker,
            )

    return opened


def waiting_run(db: Path, *, approved: bool) -> None:
    """Run ``pay-1``: it waits for a person to approve its payment ``p`` (who may have)."""

    async def go() -> None:
        async with product(db, "w1")() as runner:
            await runner.run(cli_agent.payer(), "go", tenant="acme", run_id="pay-1")
            if approved:
                await runner.approve("pay-1", "p", tenant="acme", by="ann")

    asyncio.run(go())


def test_frontier_main_shows_the_run_from_the_products_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "product.db"
    waiting_run(db, approved=False)
    assert frontier_main(["pay-1", *TENANT], runner=product(db)) == 0
    shown = capsys.readouterr().out
    assert "pay-1" in shown
    assert "waiting on" in shown
    assert frontier_main(["pay-1", *TENANT, "--json"], runner=product(db)) == 0
    facts = msgspec.json.decode(capsys.readouterr().out)
    assert (facts["run"], facts["status"], facts["waiting_on"]) == ("pay-1", "waiting", "p")
    assert not (tmp_path / "not-the-products.db").exists()


def test_the_exit_codes_are_what_a_script_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "product.db"
    waiting_run(db, approved=False)
    assert frontier_main(["nope", *TENANT], runner=product(db)) == 1
    assert capsys.readouterr().err.startswith("NothingToResumeError: ")
    assert frontier_main(["pay-1"], runner=product(db), prog="mytool inspect") == 2
    said = capsys.readouterr().err
    assert "--tenant" in said
    assert said.strip().endswith("see mytool inspect --help")
    assert (
        resume_main(["pay-1", *TENANT, "--bogus"], runner=product(db), agent=cli_agent.payer()) == 2
    )
    with sqlite3.connect(db) as conn:
        (payload,) = conn.execute(
            "SELECT payload FROM onward_frontiers WHERE run_id = 'pay-1'"
        ).fetchone()
        newer = {**msgspec.json.decode(payload), "format": FRONTIER_FORMAT + 1}
        conn.execute(
            "UPDATE onward_frontiers SET payload = ? WHERE run_id = 'pay-1'",
            (msgspec.json.encode(newer),),
        )
    capsys.readouterr()
    assert frontier_main(["pay-1", *TENANT], runner=product(db)) == 4
    assert resume_main(["pay-1", *TENANT], runner=product(db), agent=cli_agent.payer()) == 4
    assert capsys.readouterr().err.startswith("CheckpointFormatError: ")


def test_resume_main_prints_the_summary_then_carries_the_run_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "product.db"
    waiting_run(db, approved=True)
    before = len(cli_agent.EFFECTS)
    code = resume_main(["pay-1", *TENANT], runner=product(db), agent=cli_agent.payer())
    said = capsys.readouterr().out
    assert code == 0, said
    summary, _, report = said.partition("carried on by oncall under fence")
    assert "pay-1" in summary
    assert "resume would" in summary
    assert report.split()[0].isdigit()
    assert "status completed" in report
    assert [effect for effect, _ in cli_agent.EFFECTS[before:]] == ["pay"]
    # Carried on already: nothing to do, exit 0 again, and nothing paid twice.
    assert resume_main(["pay-1", *TENANT], runner=product(db), agent=cli_agent.payer()) == 0
    assert "nothing to carry on" in capsys.readouterr().out
    assert [effect for effect, _ in cli_agent.EFFECTS[before:]] == ["pay"]


def test_the_products_own_sigterm_handler_is_put_back(tmp_path: Path) -> None:
    """A product that calls a main in a process that lives on (its own shell, a service) keeps
    its SIGTERM handling: the main's own is in place only while it runs."""
    db = tmp_path / "product.db"
    waiting_run(db, approved=False)

    def products(signum: int, frame: FrameType | None) -> None:
        """The product's own SIGTERM handler."""

    previous = signal.signal(signal.SIGTERM, products)
    try:
        assert frontier_main(["pay-1", *TENANT, "--json"], runner=product(db)) == 0
        assert signal.getsignal(signal.SIGTERM) is products
    finally:
        signal.signal(signal.SIGTERM, previous)
