"""Optional OpenTelemetry spans: one per run step and one per tool call.

Only `opentelemetry-api` is used (the ``otel`` extra): the application that wants traces
installs an SDK and sets a tracer provider, as with any instrumented library. Without the
package installed, `span` costs a function call and does nothing. Spans carry ids only (run
id, fence, call id, tool name, step, disposition): no tenant, no arguments, no results; a
span left by an exception is marked failed with the exception's type, not its message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the otel extra is not installed
    _trace = None  # type: ignore[assignment]

INSTRUMENTATION = "onward"

_tracer: Any = _trace.get_tracer(INSTRUMENTATION) if _trace is not None else None


def use_tracer_provider(provider: Any | None) -> None:
    """Trace through ``provider`` instead of the global one (``None``: the global again).

    For tests and embedders that keep their own provider rather than set the process's
    global one. Does nothing without `opentelemetry-api`.
    """
    global _tracer  # noqa: PLW0603 - the module's one tracer
    if _trace is not None:
        _tracer = (
            _trace.get_tracer(INSTRUMENTATION)
            if provider is None
            else provider.get_tracer(INSTRUMENTATION)
        )


class _NoSpan:
    """What `span` yields without OpenTelemetry: attributes set on it go nowhere."""

    __slots__ = ()

    def set_attribute(self, key: str, value: Any) -> None:
        """Nothing to record."""


_NO_SPAN = _NoSpan()


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any]) -> Iterator[Any]:
    """A span named ``name`` around the block (a no-op without `opentelemetry-api`)."""
    if _tracer is None:
        yield _NO_SPAN
        return
    # OpenTelemetry would record an exception's message and traceback, which may hold a run's
    # input, a tool's arguments or a model's answer: the span says only the error's type.
    with _tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except Exception as exc:
            current.set_status(_trace.Status(_trace.StatusCode.ERROR, type(exc).__name__))
            raise
