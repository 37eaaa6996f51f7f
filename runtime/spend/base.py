"""Spend: what each model call cost, in micros (millionths of a currency unit), and the ledger
that keeps it.

A model call's cost is computed from the usage the provider reports and a `PriceTable` (micros
per input and per output token, per model), and recorded in a `SpendLedger` keyed by the run
and the seq its answer is written at. The ledger is the authority on what a run and a tenant
have spent: a run's frontier and a continuation carry token counts for reporting, never spend,
since a second copy of a number that only goes up is a second copy to disagree with. So a run
carried on into a new run starts at zero; the tenant's total goes on.

A record is idempotent: recording the same key again changes nothing (the first record stands),
so a replay or a retry never counts a call twice.

Budgets are decided on holds: before a model call, its estimated cost is held under the key
its record will take, in the same atomic step as the check that the run's and the tenant's
spend and holds leave room for it, so runs of one tenant calling at the same moment cannot all
pass its budget together. The record replaces the hold; a call that failed releases it; a hold
left by a process that died mid-call counts against the budgets, never in what was spent,
until the run is resumed (its claim releases every hold of the run) or ends (its end does); an
answer the provider gave before the death was recorded, and stays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, Protocol, runtime_checkable

import msgspec

from onward._storage import AsyncResource
from onward.errors import ConfigurationError, InvalidInputError
from onward.eventlog.events import Usage


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True):
    """What one token costs a model, in micros; fractions allowed (0.15 micros per input
    token is 0.15 of a currency unit per million tokens)."""

    input_micros: Decimal
    output_micros: Decimal

    def cost(self, usage: Usage) -> int:
        """The cost of ``usage`` in whole micros, rounded up: a budget never rounds in the
        spender's favour."""
        exact = self.input_micros * usage.input_tokens + self.output_micros * usage.output_tokens
        return int(exact.to_integral_value(rounding=ROUND_CEILING))


PriceLike = ModelPrice | tuple[Decimal | float | int | str, Decimal | float | int | str]
"""A price as `PriceTable` takes it: a `ModelPrice`, or ``(input, output)`` micros per token."""


MAX_COUNT = 2**63 - 1
"""The most micros, tokens or seq a ledger keeps in one count: a 64-bit integer, as SQLite and
PostgreSQL store it; so also the most one token may cost."""


def _micros(value: Decimal | float | int | str, model: str, which: str) -> Decimal:
    try:
        # Through str, so 0.1 is a tenth and not the binary float nearest to it.
        micros = Decimal(str(value)) if not isinstance(value, Decimal) else value
    except InvalidOperation:
        micros = Decimal("NaN")
    # Over MAX_COUNT, not one token's cost could be recorded (and 1e999999 overflows the
    # decimal arithmetic of a cost): an exponent typed wrong, never a price.
    if not micros.is_finite() or micros < 0 or micros > MAX_COUNT:
        raise ConfigurationError(
            f"model price of {model!r}: {which} micros per token must be a number from 0 to "
            f"{MAX_COUNT}, got {value!r}"
        )
    return micros


def _pair(model: str, given: object) -> tuple[Any, Any]:
    """A price's ``(input, output)``: a string or any other sequence than a pair is refused
    rather than unpacked (``"12"`` would be 1 and 2, ``"0.15/0.6"`` a bare ValueError)."""
    if isinstance(given, ModelPrice):
        return given.input_micros, given.output_micros
    if isinstance(given, tuple | list) and len(given) == 2:
        return given[0], given[1]
    raise ConfigurationError(
        f"model price of {model!r} must be a ModelPrice or a pair (input, output) of micros "
        f"per token, got {given!r}"
    )


class PriceTable:
    """Micros per input and output token, per model name (the agent's ``model``).

    A model the table does not name costs 0: its calls are still recorded (tokens and all),
    but nothing can be counted against a budget for it, so a run with a budget whose agent's
    model has no price is refused before it starts (`check_priced`).

    Args:
        prices: Model name to `ModelPrice` or ``(input, output)`` micros per token.
    """

    def __init__(self, prices: Mapping[str, PriceLike] | None = None) -> None:
        self._prices: dict[str, ModelPrice] = {}
        for model, given in (prices or {}).items():
            given_in, given_out = _pair(model, given)
            self._prices[model] = ModelPrice(
                input_micros=_micros(given_in, model, "input"),
                output_micros=_micros(given_out, model, "output"),
            )

    @classmethod
    def parse(cls, text: str) -> PriceTable:
        """The table of ``ONWARD_MODEL_PRICES``: ``MODEL=INPUT/OUTPUT`` pairs, comma-separated,
        in micros per token (``gpt-4o=2.5/10,gpt-4o-mini=0.15/0.6``); empty is no prices.

        Raises:
            ConfigurationError: A pair not of that form, or a price that is not a number of at
                least 0 (named).
        """
        prices: dict[str, PriceLike] = {}
        for pair in (p.strip() for p in text.split(",")):
            if not pair:
                continue
            # At the first "=": pairs run together by a typo (";" or " " for ",") leave the
            # rest in the price, which is then refused, not in a model nobody names.
            model, equals, price = pair.partition("=")
            given_in, slash, given_out = price.partition("/")
            if not equals or not slash or not model.strip():
                raise ConfigurationError(
                    f"ONWARD_MODEL_PRICES: {pair!r} is not MODEL=INPUT/OUTPUT (micros per token, "
                    "as in gpt-4o=2.5/10)"
                )
            if model.strip() in prices:
                raise ConfigurationError(
                    f"ONWARD_MODEL_PRICES: model {model.strip()!r} is priced twice"
                )
            prices[model.strip()] = (given_in.strip(), given_out.strip())
        return cls(prices)

    def price(self, model: str) -> ModelPrice | None:
        """The model's price, or ``None`` when the table does not name it."""
        return self._prices.get(model)

    def cost(self, model: str, usage: Usage) -> int:
        """What ``usage`` of ``model`` cost in micros; 0 for a model the table does not name."""
        price = self._prices.get(model)
        return 0 if price is None else price.cost(usage)

    def check_priced(self, model: str, *, run_id: str | None = None) -> None:
        """Refuse a budget on a model without a price: nothing could be counted against it.

        Raises:
            ConfigurationError: The table does not name ``model``.
        """
        if model not in self._prices:
            raise ConfigurationError(
                f"a budget needs the price of model {model!r}, which the price table does not "
                "name; set it (ONWARD_MODEL_PRICES or prices=PriceTable(...))",
                run_id=run_id,
            )

    @property
    def models(self) -> Sequence[str]:
        """The models the table prices, in the order given."""
        return tuple(self._prices)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{m}={p.input_micros}/{p.output_micros}" for m, p in self._prices.items()
        )
        return f"PriceTable({shown})"


class SpendEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One model call's cost, keyed by its run and the seq its answer is written at.

    Attributes:
        at: Microseconds since the epoch when it was recorded; informational.
    """

    run_id: str
    tenant: str
    seq: int
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    micros: int = 0
    at: int = 0


class Spend(msgspec.Struct, frozen=True, kw_only=True):
    """What a run or a tenant spent: micros, tokens and model calls."""

    micros: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    def plus(self, entry: SpendEntry) -> Spend:
        """This spend with one more call recorded."""
        return Spend(
            micros=self.micros + entry.micros,
            input_tokens=self.input_tokens + entry.input_tokens,
            output_tokens=self.output_tokens + entry.output_tokens,
            calls=self.calls + 1,
        )


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """What `SpendLedger.hold` decided.

    Attributes:
        held: The estimate is held (or its key was held or recorded already); False when it
            would pass a budget, and nothing was held.
        run_micros: What the run had recorded and held before this hold.
        tenant_micros: What every run of the tenant had recorded and held before it.
    """

    held: bool
    run_micros: int
    tenant_micros: int


def hold_decided(
    cost: int,
    *,
    run_micros: int,
    tenant_micros: int,
    run_budget: int | None,
    tenant_budget: int | None,
) -> Hold:
    """Whether a call estimated at ``cost`` fits both budgets given what the run and its
    tenant spent and hold: ``spent + cost <= budget`` for each budget that is set."""
    fits = all(
        budget is None or spent + cost <= budget
        for budget, spent in ((run_budget, run_micros), (tenant_budget, tenant_micros))
    )
    return Hold(held=fits, run_micros=run_micros, tenant_micros=tenant_micros)


def check_entry(entry: SpendEntry) -> None:
    """Refuse an entry no ledger may keep: a seq below 1, a negative count, or one over
    `MAX_COUNT` (which a driver would refuse with an error of its own, naming nothing).

    Raises:
        InvalidInputError: Naming the field.
    """
    if entry.seq < 1:
        raise InvalidInputError(
            f"a spend entry's seq starts at 1, got {entry.seq}", run_id=entry.run_id
        )
    for field in ("input_tokens", "output_tokens", "micros"):
        if getattr(entry, field) < 0:
            raise InvalidInputError(
                f"a spend entry's {field} cannot be negative, got {getattr(entry, field)}",
                run_id=entry.run_id,
            )
    for field in ("seq", "input_tokens", "output_tokens", "micros"):
        if getattr(entry, field) > MAX_COUNT:
            raise InvalidInputError(
                f"a spend entry's {field} is at most {MAX_COUNT}, got {getattr(entry, field)}",
                run_id=entry.run_id,
            )


@runtime_checkable
class SpendLedger(AsyncResource, Protocol):
    """What each model call cost, per run and per tenant: the authority on spend."""

    async def hold(
        self,
        entry: SpendEntry,
        *,
        run_budget: int | None = None,
        tenant_budget: int | None = None,
    ) -> Hold:
        """Hold ``entry.micros``, a model call's estimated cost, under its key until the call's
        record replaces it, if the run's and the tenant's recorded and held spend leave room
        for it: ``spent + entry.micros <= budget`` for each budget given. The check and the
        hold are one atomic step, so holds made at the same moment see each other.

        A key held or recorded already is left as it is (``held`` True).

        Raises:
            InvalidInputError: A seq below 1 or a negative count (`check_entry`).
        """
        ...

    async def release(self, run_id: str, seq: int) -> None:
        """Drop the hold under (``run_id``, ``seq``): the call failed, nothing was recorded.
        Nothing held there: nothing changes."""
        ...

    async def release_run(self, run_id: str) -> int:
        """Drop every hold of ``run_id``: the run has ended, so none of its calls is being
        made, and a hold left by a worker that died mid-call (a run given up, or answered
        and finished elsewhere) must not count against its tenant's budget forever. Recorded
        spend stays. Returns the micros that were held (0 when nothing was)."""
        ...

    async def record(self, entry: SpendEntry) -> bool:
        """Record one call's cost under (``run_id``, ``seq``), once, replacing its hold.

        Returns:
            True if recorded now; False if that key was recorded before, in which case nothing
            changes (the first record stands, whatever this one says).

        Raises:
            InvalidInputError: A seq below 1 or a negative count (`check_entry`).
        """
        ...

    async def run_total(self, run_id: str) -> Spend:
        """What a run spent; nothing recorded is zero."""
        ...

    async def run_totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        """What each of several runs spent (one query, for a listing); a run with nothing
        recorded is left out."""
        ...

    async def tenant_total(self, tenant: str) -> Spend:
        """What every run of a tenant spent, together."""
        ...

    async def entries(self, run_id: str) -> list[SpendEntry]:
        """A run's recorded calls, by seq."""
        ...


__all__ = [
    "MAX_COUNT",
    "Hold",
    "ModelPrice",
    "PriceLike",
    "PriceTable",
    "Spend",
    "SpendEntry",
    "SpendLedger",
    "check_entry",
    "hold_decided",
]
