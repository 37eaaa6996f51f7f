"""Projections of the event log: the projector, frontier stores, rebuilds (not yet built)."""

__all__: list[str] = []
