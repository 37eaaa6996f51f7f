"""The application API: `App` (start, watch, answer and find runs), `RunStream` (a run's
messages read from the log), `RunMessage`, and the module-level helpers (``open_app``,
``query``, ``resume`` and their ``_sync`` forms) that ``onward`` re-exports.
"""

from onward.runtime.options import DEFAULT_TENANT

from .api import get_session_state, open_app, query, query_sync, resume, resume_sync
from .app import App, SessionState, current_app
from .messages import Answers, MessageMapper, MessageType, RunMessage
from .stream import Position, RunStream, StreamSource

__all__ = [
    "DEFAULT_TENANT",
    "Answers",
    "App",
    "MessageMapper",
    "MessageType",
    "Position",
    "RunMessage",
    "RunStream",
    "SessionState",
    "StreamSource",
    "current_app",
    "get_session_state",
    "open_app",
    "query",
    "query_sync",
    "resume",
    "resume_sync",
]
