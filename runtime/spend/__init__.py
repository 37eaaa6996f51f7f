"""Spend and budgets: what each model call cost (micros), kept in a ledger per run and tenant,
and the budgets that stop a run before a call that would pass them."""

from .base import Hold, ModelPrice, PriceTable, Spend, SpendEntry, SpendLedger
from .budget import Budgets, estimate_usage
from .memory import MemorySpendLedger
from .postgres import PostgresSpendLedger
from .sqlite import SqliteSpendLedger

__all__ = [
    "Budgets",
    "Hold",
    "MemorySpendLedger",
    "ModelPrice",
    "PostgresSpendLedger",
    "PriceTable",
    "Spend",
    "SpendEntry",
    "SpendLedger",
    "SqliteSpendLedger",
    "estimate_usage",
]
