"""Spend ledgers: `SpendLedgerConformance` on memory, SQLite and PostgreSQL; the price table."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from support.pg import fresh_schema
from support.spend import PRICES, stepper, steps

from onward.errors import BudgetExceededError, ConfigurationError
from onward.eventlog.events import Usage
from onward.runtime.backends import open_backends
from onward.runtime.settings import Settings
from onward.runtime.spend import (
    MemorySpendLedger,
    ModelPrice,
    PostgresSpendLedger,
    PriceTable,
    SpendLedger,
    SqliteSpendLedger,
)
from onward.testing import SpendLedgerConformance
from onward.testing.spend import entry


class TestMemorySpendLedger(SpendLedgerConformance):
    async def open_ledger(self) -> SpendLedger:
        return MemorySpendLedger()


class TestSqliteSpendLedger(SpendLedgerConformance):
    """Every ledger of a test is on one file, as every process of a deployment is."""

    path: Path

    @pytest.fixture(autouse=True)
    def _file(self, tmp_path: Path) -> None:
        self.path = tmp_path / "spend.db"

    async def open_ledger(self) -> SpendLedger:
        return await SqliteSpendLedger.open(self.path)

    async def open_another(self, ledger: SpendLedger) -> SpendLedger:
        return await SqliteSpendLedger.open(self.path)


class TestPostgresSpendLedger(SpendLedgerConformance):
    """Every ledger of a test is on one schema of its own, as every worker of a deployment."""

    database_url: str
    schema: str

    @pytest.fixture(autouse=True)
    def _server(self, database_url: str) -> None:
        self.database_url = database_url

    async def open_ledger(self) -> SpendLedger:
        self.schema = await self.exit_stack.enter_async_context(fresh_schema(self.database_url))
        return await PostgresSpendLedger.open(self.database_url, schema=self.schema)

    async def open_another(self, ledger: SpendLedger) -> SpendLedger:
        return await PostgresSpendLedger.open(self.database_url, schema=self.schema)


async def test_a_read_only_sqlite_ledger_reads_what_was_recorded(tmp_path: Path) -> None:
    path = tmp_path / "spend.db"
    async with SqliteSpendLedger(path) as ledger:
        await ledger.record(entry("run-1", "acme", 1, 70))
    async with SqliteSpendLedger(path, readonly=True) as reader:
        assert (await reader.run_total("run-1")).micros == 70
        assert (await reader.run_totals(["run-1"]))["run-1"].calls == 1


async def test_a_read_only_sqlite_ledger_sees_spend_recorded_after_it_opened(
    tmp_path: Path,
) -> None:
    """Opened on a quiet file (no ``-wal`` file: read ``immutable``), a long-lived reader
    (`ExecutionManager()`, ``onward runs``) sees what a writer records afterwards at its next
    read, not the file as it was when it opened it."""
    path = tmp_path / "spend.db"
    async with SqliteSpendLedger(path) as ledger:
        await ledger.record(entry("run-1", "acme", 1, 70))
    assert not Path(f"{path}-wal").exists()  # noqa: ASYNC240
    async with SqliteSpendLedger(path, readonly=True) as reader:
        assert (await reader.run_total("run-1")).micros == 70
        async with SqliteSpendLedger(path) as ledger:
            await ledger.record(entry("run-1", "acme", 2, 30))
        assert (await reader.run_total("run-1")).micros == 100
        async with SqliteSpendLedger(path) as ledger:
            await ledger.record(entry("run-1", "acme", 3, 5))
        assert (await reader.run_totals(["run-1"]))["run-1"].micros == 105
        async with SqliteSpendLedger(path) as ledger:
            await ledger.record(entry("run-1", "acme", 4, 1))
        assert (await reader.tenant_total("acme")).micros == 106
        async with SqliteSpendLedger(path) as ledger:
            await ledger.record(entry("run-1", "acme", 5, 1))
        assert [e.seq for e in await reader.entries("run-1")] == [1, 2, 3, 4, 5]


def test_a_call_costs_its_tokens_at_the_models_price_rounded_up() -> None:
    prices = PriceTable({"gpt-4o-mini": ("0.15", "0.6"), "m": (2, 5)})
    assert prices.cost("m", Usage(input_tokens=1200, output_tokens=300)) == 3900
    # 0.15 * 7 + 0.6 * 1 = 1.65 micros: a part of a micro counts as a whole one.
    assert prices.cost("gpt-4o-mini", Usage(input_tokens=7, output_tokens=1)) == 2
    assert prices.cost("gpt-4o-mini", Usage(input_tokens=20, output_tokens=0)) == 3
    assert prices.cost("gpt-4o-mini", Usage()) == 0


def test_fractions_are_decimal_not_binary() -> None:
    prices = PriceTable({"m": (0.2, 0.1)})
    # As binary floats 0.2 * 14 + 0.1 * 2 is a hair over 3 and would round up to 4.
    assert prices.cost("m", Usage(input_tokens=14, output_tokens=2)) == 3
    exact = ModelPrice(input_micros=Decimal("0.2"), output_micros=Decimal("0.1"))
    assert prices.price("m") == exact


def test_a_model_without_a_price_costs_nothing_but_cannot_carry_a_budget() -> None:
    prices = PriceTable({"m": (1, 1)})
    assert prices.cost("unknown", Usage(input_tokens=10**6, output_tokens=10**6)) == 0
    prices.check_priced("m")
    with pytest.raises(ConfigurationError, match="'unknown'"):
        prices.check_priced("unknown")


@pytest.mark.parametrize("given", ["0.15/0.6", "12", 0.15, (1, 2, 3), None])
def test_a_price_that_is_not_a_pair_is_refused_naming_the_model(given: object) -> None:
    """Not unpacked as it comes: ``"12"`` would be 1 and 2 micros, silently; the setting's
    ``"0.15/0.6"`` in code, or a bare number, a ValueError or TypeError naming nothing."""
    with pytest.raises(ConfigurationError, match="model price of 'm'"):
        PriceTable({"m": given})  # type: ignore[dict-item]


def test_the_setting_is_model_input_output_pairs() -> None:
    settings = Settings(model_prices=" gpt-4o=2.5/10 , m=1/5,")
    prices = settings.price_table()
    assert prices.models == ("gpt-4o", "m")
    assert prices.cost("gpt-4o", Usage(input_tokens=1000, output_tokens=100)) == 3500
    assert Settings().price_table().models == ()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("gpt-4o=2.5", "is not MODEL=INPUT/OUTPUT"),
        ("=1/2", "is not MODEL=INPUT/OUTPUT"),
        ("m=1/x", "output micros per token must be a number"),
        ("m=-1/2", "input micros per token must be a number"),
        ("m=nan/2", "input micros per token must be a number"),
        # An exponent typed wrong: not one token's cost could be recorded, or even computed.
        ("m=1e400/2", "input micros per token must be a number from 0 to 9223372036854775807"),
        ("m=1/1e999999", "output micros per token must be a number from 0"),
        # A semicolon or a space for the comma: two prices run together, not one odd model.
        ("gpt-4o-mini=0.15/0.6;gpt-4o=2.5/10", "gpt-4o"),
        ("gpt-4o-mini=0.15/0.6 gpt-4o=2.5/10", "gpt-4o"),
        # The same model twice: which price was meant?
        ("m=1/2,m=3/4", "'m'"),
    ],
)
def test_a_bad_price_setting_fails_at_start_naming_the_variable(text: str, said: str) -> None:
    with pytest.raises(ConfigurationError, match="ONWARD_MODEL_PRICES") as caught:
        Settings(model_prices=text)
    assert said in str(caught.value)


async def test_an_estimate_past_what_a_ledger_counts_is_refused_by_the_budget(
    tmp_path: Path,
) -> None:
    """A ``max_tokens`` no model has makes an estimate no 64-bit count holds: the call is
    held at the most a ledger counts, so the budget stops the run, not the ledger's driver."""
    settings = Settings(backend="sqlite", sqlite_path=tmp_path / "onward.db", model_prices=PRICES)
    async with open_backends(settings) as backends:
        agent = stepper(budget_micros=5000, model_settings={"max_tokens": 10**30})
        provider = steps()
        with pytest.raises(BudgetExceededError) as caught:
            await backends.runner(provider).run(agent, "go", tenant="acme")
        assert provider.calls == 0
        assert caught.value.scope == "run"
