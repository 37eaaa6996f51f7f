"""The runner, resume planning, leases, compaction, garbage collection and the CLI."""

__all__: list[str] = []
