"""The defaults of `onward projector`'s options, apart from `KafkaProjector` (which takes
them too) so that the command's help, and ``onward --help``, show them without importing
aiokafka (~170 ms)."""

PROJECTOR_FLUSH_EVENTS = 50_000
"""`onward projector` stores after folding this many events while it works through a backlog..."""
PROJECTOR_FLUSH_INTERVAL = 1.0
"""...or after this many seconds; and whenever it has caught up (at most every
`CAUGHT_UP_STORE_S`)."""
CAUGHT_UP_STORE_S = 0.05
"""A projector that has caught up stores what it folded at most this often: each store is one
PostgreSQL transaction, so storing every small batch under a steady trickle of events cost more
than folding them. The frontier lags the log by at most this (plus the store) for it."""

FOCUS_SLICE_S = 6.0
"""A projector behind in several partitions folds one of them at a time, for about this long
(or until it is drained), the others behind paused; then the next one behind. See `_Turns` in
`onward.projections.kafka`.
Each turn after a partition's first loads its runs again (the turns of the others dropped them
from the cache): at 100,000 runs over 12 partitions, 2 s turns loaded 102,794 runs again and
folded at 16,700 events/s, 6 s turns none and 27,100 events/s (`bench/project.py`)."""
