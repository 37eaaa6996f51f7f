"""Masking secrets out of a run's events, once, before they are encoded.

A run's conversation and its tool calls are where secrets end up: the API key a user pasted into
a prompt, the bearer token a tool was handed, the database URL with its password inside. Every
event is written to a durable log (Kafka, SQLite) and folded into PostgreSQL, and each of those
keeps it for as long as the run's history is kept, readable by whoever can read the store.

So redaction runs in exactly one place: on the event, before it is encoded. Every backend then
inherits it, and no backend can forget it. Running it before encoding also means masking
happens before sizing: the size limits of the log are checked against the bytes actually
written, never against a payload that still held the secret.

Binary values (``bytes``, ``bytearray``, ``memoryview``, such as image parts of a message) are
left exactly as they are. A pattern run over arbitrary bytes matches by accident, and a masked
binary payload is neither the original nor honestly empty: a corrupt image is worse than an
unredacted one, which the caller can still choose not to send.

Masking is pattern matching, so it is best effort: a secret of a shape no pattern knows passes
through, which is what ``extra_patterns`` is for. Where a pattern knows which part of the match
is the secret (the password of a URL, the token after ``Bearer``, the value after ``api_key=``),
only that part is masked and the text around it stays readable. Turning redaction off
(``redact=False``: a runner given ``Redactor(enabled=False)``) is only for stores that are
already trusted with the secrets themselves, such as an in-memory log in a test; never for a
shared log.

Strings shorter than the shortest secret are returned without any regex work, and a value with
nothing to mask comes back as the very same object, so clean events cost no copies.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, Final, TypeVar

import msgspec

from onward.errors import ConfigurationError
from onward.eventlog.events import Event

DEFAULT_MASK: Final = "[REDACTED]"
"""What a secret is replaced with unless the redactor is given another mask."""

_EventT = TypeVar("_EventT", bound=Event)
_StructT = TypeVar("_StructT", bound=msgspec.Struct)

_ENVELOPE: Final = frozenset({"run_id", "tenant", "seq", "fence", "at", "format"})
"""Envelope fields: identifiers and numbers the log routes and orders by, never masked."""

_SHORTEST_SECRET: Final = 7
"""No built-in pattern matches fewer characters (``pwd=abc``); shorter strings are skipped."""

_WORD_EDGE = r"(?<![A-Za-z0-9_-].)"
"""Placed after a token's first character: the character before the token is not a word's.

Written after the first character rather than before it so that every branch of a scan starts
with a plain character, which lets the regex engine skip to candidate positions in C.
"""


def _at_word_edge(token: str) -> str:
    """A token pattern that only matches where a word starts (``sk-`` but not ``risk-``).

    Args:
        token: A pattern whose first character is a plain character.
    """
    return token[0] + _WORD_EDGE + token[1:]


_NOT_A_VALUE = (
    r"(?!(?i:null|none|nil|true|false|undefined|str|string|bytes|required|optional)"
    r"(?![A-Za-z0-9_]))"
    r"(?!\$\{|\$\(|\$[A-Za-z_]|\{\{|%\(|%s|<|\*|\[|-----)"
)
"""Values that are not secrets: empty markers, type names, templates, placeholders, masks.

A value starting with ``-----`` is left to the PEM pattern, which masks the whole block.
"""

_VALUE = (
    r'"((?:[^"\\\n]|\\.)+)"'
    r"|'([^'\n]+)'"
    r'|\\"((?:[^"\\\n]|\\\\\\"|\\[^"\n])+)\\"'
    r"|" + _NOT_A_VALUE + r"""((?:[^\s"'\\&,;]|[&,;](?![\w.\[\]-]*=)){3,})"""
)
"""The value after a label: double-quoted, single-quoted, escaped-quoted (JSON in a JSON
string) or bare. Only the value is masked. A bare value ends at white space or a quote, and at
``&``, ``,`` or ``;`` only where the next ``name=`` begins (``?password=x&next=/``,
``AccountKey=x;EndpointSuffix=``), so a password holding those characters is masked whole."""

_TOKEN_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    (
        "pem_private_key",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?s:.*?)"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|\Z)",
    ),
    ("anthropic_key", _at_word_edge(r"sk-ant-[A-Za-z0-9_-]{20,}")),
    (
        "openai_key",
        _at_word_edge(
            r"sk-(?:proj-|svcacct-|admin-)?(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Z])"
            r"[A-Za-z0-9_-]{20,}"
        ),
    ),
    ("aws_access_key_id", _at_word_edge(r"A(?:KIA|SIA|BIA|CCA)[A-Z0-9]{16}(?![A-Za-z0-9])")),
    ("github_token", _at_word_edge(r"gh[pousr]_[A-Za-z0-9]{36,}")),
    ("github_fine_grained_token", _at_word_edge(r"github_pat_[A-Za-z0-9_]{22,}")),
    ("gitlab_token", _at_word_edge(r"gl(?:pat|ptt|dt|rt)-[A-Za-z0-9_-]{20,}")),
    ("slack_token", _at_word_edge(r"xox[abposre]-[A-Za-z0-9-]{10,}")),
    ("slack_app_token", _at_word_edge(r"xapp-\d-[A-Za-z0-9-]{10,}")),
    (
        "slack_webhook",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/([A-Za-z0-9_/+-]{20,})",
    ),
    *(("stripe_key", _at_word_edge(first + r"k_(?:live|test)_[A-Za-z0-9]{20,}")) for first in "sr"),
    ("stripe_webhook_secret", _at_word_edge(r"whsec_[A-Za-z0-9+/]{24,}")),
    ("google_api_key", _at_word_edge(r"AIza[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])")),
    ("google_oauth_token", _at_word_edge(r"ya29\.[A-Za-z0-9_-]{20,}")),
    ("sendgrid_key", _at_word_edge(r"SG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64}")),
    ("twilio_api_key", _at_word_edge(r"SK[0-9a-f]{32}(?![A-Za-z0-9])")),
    ("npm_token", _at_word_edge(r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])")),
    ("huggingface_token", _at_word_edge(r"hf_(?=[a-z0-9]*[A-Z])[A-Za-z0-9]{30,}")),
    ("jwt", _at_word_edge(r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*")),
    *(
        (
            "bearer_token",
            _at_word_edge(first + r"earer[ \t]+((?=[A-Za-z._~+/-]*[0-9])[A-Za-z0-9._~+/-]{16,}=*)"),
        )
        for first in "Bb"
    ),
    (
        "env_token",
        r"_TOKEN(?:\\?[\"'])?[ \t]*[:=](?![=:])[ \t]*(?:" + _VALUE + ")",
    ),
)
"""Secrets recognised by their own shape, scanned as one alternation.

A capturing group marks the part of a match that is the secret (the rest is kept); a pattern
without one is masked whole. Every other group is non-capturing.
"""

_CONTEXT_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    ("url_password", r":(?<=[A-Za-z0-9+.-]:)//[^\s:/?#@]*:([^\s/?#]+)@"),
    (
        "cli_user_password",
        _at_word_edge(r"-(?:u|-user)(?:[ \t]+|=)[\"']?[^\s:\"']+:")
        + r"""(?!\d+(?:[\s"']|$))([^\s"']{2,})""",
    ),
)
"""Passwords after a user name (``scheme://user:password@``, ``curl -u user:password``).

The user name is part of the match but may itself be a token (``https://<token>:x@github.com``),
so these run as a scan of their own and their masks are merged with the others'.
"""

_LABELS: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "secret_key",
    "secret_access_key",
    "api_key",
    "api_token",
    "access_token",
    "auth_token",
    "refresh_token",
    "id_token",
    "session_token",
    "bearer_token",
    "bot_token",
    "private_key",
    "account_key",
    "shared_access_key",
)
"""Names whose value is masked when followed by ``=``, ``:``, ``:=`` or ``=>``.

Matched without regard to case, with ``_``, ``-`` or nothing between the words, and after any
prefix: ``DB_PASSWORD``, ``client_secret``, ``x-api-key``, ``AccountKey``, ``_authToken``.
"""


def _reversed_label(label: str) -> str:
    """The pattern of a label read backwards (``api_key`` becomes ``yek[_-]?ipa``)."""
    return "[_-]?".join(word[::-1] for word in reversed(label.split("_")))


_LABEL_SCAN: Final = re.compile(
    # Run over the reversed text: a separator is rare where a label's first letter is not, so
    # starting from the separator lets the engine skip to candidates in C.
    r"[:=>](?:(?<=>)=|(?<==):?|(?<=:))[ \t]*(?:[\"']\\?)?"
    r"(?i:(noitazirohtua)|" + "|".join(_reversed_label(label) for label in _LABELS) + ")"
    r"(?![\w.-]*//:)"
)
"""A separator, then (reversed) a label or ``Authorization`` before it.

A label that is the user name of a URL (``https://x-access-token:<token>@github.com``) is left
to the URL pattern, which masks the password and keeps the host."""

_LABELLED_VALUE: Final = re.compile(r"[ \t]*(?![=:])(?:" + _VALUE + ")")
"""The value after a label's separator; one of its groups is the secret."""

_HEADER_VALUE: Final = re.compile(
    r"[ \t]*(?:\\?[\"'])?(?:(?i:basic|bearer|token|digest)[ \t]+([A-Za-z0-9._~+/-]{8,}=*)"
    r"|(?=[A-Za-z]*[0-9._~+/-])([A-Za-z0-9._~+/-]{8,}=*))"
)
"""The credentials after ``Authorization:``. After a scheme (``Basic``, ``Bearer``) anything is
masked; without one, a plain word (``Authorization: required``) is not a credential."""


class _Scan:
    """One alternation of patterns whose capturing groups mark the secret part of a match."""

    __slots__ = ("regex",)

    def __init__(self, patterns: Sequence[tuple[str, str]]) -> None:
        self.regex = re.compile("|".join(source for _name, source in patterns))

    def spans(self, text: str, into: list[tuple[int, int]]) -> None:
        """Append the span to mask of every match in ``text``."""
        into.extend(_secret_span(match) for match in self.regex.finditer(text))


def _secret_span(match: re.Match[str]) -> tuple[int, int]:
    """The secret part of a match: the capturing group that took part, else the whole match."""
    group = match.lastindex
    return match.span() if group is None else match.span(group)


def _extra_span(match: re.Match[str]) -> tuple[int, int]:
    """The part of a caller's pattern match to mask: its ``secret`` group if it took part."""
    if "secret" in match.re.groupindex:
        start, end = match.span("secret")
        if start >= 0:
            return start, end
    return match.span()


def _labelled_spans(text: str, into: list[tuple[int, int]]) -> None:
    """Append the span of every value that follows a secret's label or ``Authorization``.

    Labels are found right to left; their values are then read left to right, skipping a label
    that sits inside a value already masked, so each character is read once (``pwd=`` repeated
    a thousand times is one value, not a thousand overlapping ones).
    """
    if ":" not in text and "=" not in text:
        return
    length = len(text)
    found = [(length - hit.start(), hit.lastindex) for hit in _LABEL_SCAN.finditer(text[::-1])]
    read_until = 0
    for position, header in reversed(found):
        if position < read_until:
            continue
        value = (_HEADER_VALUE if header else _LABELLED_VALUE).match(text, position)
        if value is not None:
            into.append(_secret_span(value))
            read_until = value.end()


_TOKENS: Final = _Scan(_TOKEN_PATTERNS)
_CONTEXTS: Final = _Scan(_CONTEXT_PATTERNS)


@functools.cache
def _field_names(struct_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The field names of a Struct type, looked up once per type."""
    return tuple(field.name for field in msgspec.structs.fields(struct_type))


def _compile_extra(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    """Compile one caller-supplied pattern, or say which one is unusable and why."""
    if isinstance(pattern, re.Pattern):
        if not isinstance(pattern.pattern, str):
            raise ConfigurationError(
                f"extra redaction pattern {pattern.pattern!r} is a bytes pattern; "
                "pass a str pattern, since redaction runs over text"
            )
        compiled = pattern
    elif isinstance(pattern, str):
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigurationError(
                f"extra redaction pattern `{pattern}` is not a valid regular expression: {exc}"
            ) from exc
    else:
        raise ConfigurationError(
            f"extra redaction pattern {pattern!r} is a {type(pattern).__name__}, not a pattern; "
            "pass a str or a compiled re.Pattern"
        )
    if compiled.match("") is not None:
        raise ConfigurationError(
            f"extra redaction pattern `{compiled.pattern}` matches the empty string, "
            "so it would mask nothing and everything; make it require at least one character"
        )
    return compiled


class Redactor:
    """Masks secrets in text, in JSON-like values and in events.

    A redactor is immutable once built and safe to share between tasks and threads.

    Args:
        extra_patterns: Regular expressions for secrets of shapes the built-in patterns do not
            know (an internal token format, employee ids). A match is masked whole, or only its
            group named ``secret`` when the pattern has one.
        enabled: ``False`` makes every method return its argument untouched. Only for stores
            already trusted with the secrets themselves.
        mask: What each secret is replaced with.

    Raises:
        ConfigurationError: An extra pattern does not compile, is a bytes pattern, or matches
            the empty string; the message names the pattern.
    """

    __slots__ = ("_enabled", "_extras", "_mask", "_min_length")

    def __init__(
        self,
        *,
        extra_patterns: Sequence[str | re.Pattern[str]] = (),
        enabled: bool = True,
        mask: str = DEFAULT_MASK,
    ) -> None:
        if isinstance(extra_patterns, str):
            raise ConfigurationError(
                f"extra_patterns must be a sequence of patterns, not the single string "
                f"{extra_patterns!r}; pass ({extra_patterns!r},)"
            )
        self._extras: tuple[re.Pattern[str], ...] = tuple(
            _compile_extra(pattern) for pattern in extra_patterns
        )
        self._enabled = enabled
        self._mask = mask
        self._min_length = 1 if self._extras else _SHORTEST_SECRET

    @property
    def enabled(self) -> bool:
        """Whether this redactor masks anything at all."""
        return self._enabled

    def redact_text(self, text: str) -> str:
        """Mask every secret in a string.

        Args:
            text: Any text: a message, a log line, a JSON document, a command.

        Returns:
            The text with each secret, or each secret part of a match, replaced by the mask. The
            same object when nothing was masked.
        """
        if not self._enabled or len(text) < self._min_length:
            return text
        spans: list[tuple[int, int]] = []
        if len(text) >= _SHORTEST_SECRET:
            _TOKENS.spans(text, spans)
            _CONTEXTS.spans(text, spans)
            _labelled_spans(text, spans)
        for pattern in self._extras:
            spans.extend(_extra_span(match) for match in pattern.finditer(text))
        if not spans:
            return text
        masked = self._apply(text, spans)
        return text if masked == text else masked

    def _apply(self, text: str, spans: list[tuple[int, int]]) -> str:
        """Replace the spans, merging those that overlap or touch, so no mask is masked again."""
        spans.sort()
        pieces: list[str] = []
        kept_until = 0
        start, end = spans[0]
        for next_start, next_end in spans[1:]:
            if next_start <= end:
                end = max(end, next_end)
                continue
            if end > start:
                pieces += (text[kept_until:start], self._mask)
                kept_until = end
            start, end = next_start, next_end
        if end > start:
            pieces += (text[kept_until:start], self._mask)
            kept_until = end
        pieces.append(text[kept_until:])
        return "".join(pieces)

    def redact(self, value: Any) -> Any:
        """Mask every secret in a JSON-like value.

        Strings are masked; lists, tuples, sets and dict values are walked (dict keys are kept as
        they are); msgspec Structs are walked field by field (an event's envelope is kept). Binary
        values and every other leaf are returned untouched.

        Args:
            value: A string, a container of JSON-like values, a Struct, or any other leaf.

        Returns:
            The value with its secrets masked; containers and Structs are copied only along the
            path to a change. The same object when nothing was masked.
        """
        if not self._enabled:
            return value
        return self._walk(value)

    def redact_event(self, event: _EventT) -> _EventT:
        """Mask every secret inside an event, keeping its envelope.

        Args:
            event: The event about to be encoded.

        Returns:
            A copy with every string inside its fields masked, or the same event when nothing was
            masked or the redactor is disabled. ``run_id``, ``tenant``, ``seq``, ``fence``, ``at``
            and ``format`` are never touched.
        """
        if not self._enabled:
            return event
        return self._walk_struct(event, _ENVELOPE)

    def _walk(self, value: Any) -> Any:
        """Mask the strings inside one value, whatever its type."""
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            return self._walk_dict(value)
        if isinstance(value, list | tuple | set | frozenset):
            return self._walk_collection(value)
        if isinstance(value, msgspec.Struct):
            return self._walk_struct(value, _ENVELOPE if isinstance(value, Event) else frozenset())
        # Leaves: numbers, None, and binary values, which are never masked.
        return value

    def _walk_collection(
        self, value: list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any]
    ) -> list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any]:
        """Walk the items; copy the collection, as its own kind, only once an item changes."""
        copy: list[Any] | None = None
        for index, item in enumerate(value):
            new = self._walk(item)
            if new is not item:
                if copy is None:
                    copy = list(value)
                copy[index] = new
        if copy is None:
            return value
        if isinstance(value, list):
            return copy
        if isinstance(value, tuple):
            return tuple(copy)
        return type(value)(copy)

    def _walk_dict(self, value: dict[Any, Any]) -> dict[Any, Any]:
        """Walk the values, never the keys; copy the dict only once a value changes."""
        copy: dict[Any, Any] | None = None
        for key, item in value.items():
            new = self._walk(item)
            if new is not item:
                if copy is None:
                    copy = dict(value)
                copy[key] = new
        return value if copy is None else copy

    def _walk_struct(self, value: _StructT, keep: frozenset[str]) -> _StructT:
        """Walk every field not in ``keep``; replace the Struct only if a field changed."""
        changes: dict[str, Any] = {}
        for name in _field_names(type(value)):
            if name in keep:
                continue
            old = getattr(value, name)
            new = self._walk(old)
            if new is not old:
                changes[name] = new
        return msgspec.structs.replace(value, **changes) if changes else value


__all__ = ["DEFAULT_MASK", "Redactor"]
