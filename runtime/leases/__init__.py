"""Leases with fencing: one worker per run."""

from .base import LeasePolicy, LeaseStore, RunLease

__all__ = ["LeasePolicy", "LeaseStore", "RunLease"]
