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

Values are also masked by the name they are stored under. A dict key that names a secret
(``password``, ``api_key``, ``*_token``, ``Authorization``, ``Cookie``...: `DEFAULT_SECRET_KEYS`,
compared without regard to case, with ``-``, spaces and camelCase read as ``_``) has its whole
value masked: a string becomes the mask, a number (a Decimal) or a UUID too (a numeric PIN, a
session id are still secrets), and every string and number inside a nested dict or list under
it. ``None``, booleans and binary
values are kept. ``secret_keys`` (or ``ONWARD_REDACT_KEYS``) adds names. Dict keys are scanned
as text as well, so a secret used as a key (``{"sk-ant-...": 1}``) is masked; two keys that
mask to the same text are kept apart by a ``#2``, ``#3`` suffix.

A dataclass or attrs instance is written to the log as an object of its fields, so it is masked
as that dict would be (and comes back as the dict when anything in it was masked).

Values nested thousands of levels deep are masked like any other: the walk recurses only over
the first levels (where values live, and where recursion is fastest), then goes on with a stack
of its own instead of exhausting the interpreter's; a container that holds itself is not walked
into again (no encoder could write it anyway).

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

import dataclasses
import datetime
import decimal
import functools
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from itertools import count, repeat
from operator import is_not
from typing import Any, Final, TypeVar

import msgspec

from onward.errors import ConfigurationError
from onward.eventlog.events import Event

from .environment import refuse_disabled_redaction

DEFAULT_MASK: Final = "[REDACTED]"
"""What a secret is replaced with unless the redactor is given another mask."""

DEFAULT_SECRET_KEYS: Final[tuple[str, ...]] = (
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "*_password",
    "*_passwd",
    "*_passphrase",
    "passwords",
    "*_passwords",
    "passphrases",
    "secret",
    "*_secret",
    "secrets",
    "*_secrets",
    "secret_key",
    "*_secret_key",
    "*_secret_access_key",
    "token",
    "*_token",
    "api_key",
    "apikey",
    "*_api_key",
    "*_apikey",
    "api_keys",
    "apikeys",
    "*_api_keys",
    "*_apikeys",
    "authorization",
    "proxy_authorization",
    "cookie",
    "set_cookie",
    "cookies",
    "session",
    "sessionid",
    "session_id",
    "private_key",
    "*_private_key",
    "private_keys",
    "*_private_keys",
    "credential",
    "*_credential",
    "credentials",
    "*_credentials",
)
"""Dict keys whose whole value is masked (``*_token``: any key ending in ``_token``).

Plurals too (``passwords``, ``api_keys``: a dict or list of them), but not ``tokens``, which
is as often a count of them (``max_tokens``, ``input_tokens``) as the tokens themselves.

Compared after normalising the key: camelCase is split (``accessToken`` is ``access_token``,
``DBPassword`` is ``db_password``),
``-``, spaces and other separators become ``_``, and case is ignored, so ``X-API-Key``,
``client_secret``, ``Set-Cookie`` and ``refreshToken`` all match.
"""

REDACT_KEYS_VARIABLE: Final = "ONWARD_REDACT_KEYS"
"""The environment variable whose comma-separated names a `Redactor` built without
``secret_keys`` adds to `DEFAULT_SECRET_KEYS`."""

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
    ("groq_key", _at_word_edge(r"gsk_[A-Za-z0-9]{40,}")),
    ("xai_key", _at_word_edge(r"xai-[A-Za-z0-9]{40,}")),
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

_SPACED_PASSWORD_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    (
        "password_spaced",
        r"(?:MYSQL_PWD|[Pp](?i:ass(?:word|wd|phrase)))[ \t]+(?![=:])"
        r"(?=[^\s\"']*[0-9!@#$%^&*+/~])" + _NOT_A_VALUE + r"""([^\s"'\\]{4,})""",
    ),
)
_MYSQL_PASSWORD_PATTERNS: Final[tuple[tuple[str, str], ...]] = (
    (
        "mysql_password_flag",
        r"m(?:ysql(?:dump|admin|check|import|show)?|ariadb)(?![\w-])[^\n]{0,200}?"
        r"""[ \t]-p([^\s"'\\]+)""",
    ),
)
"""Secrets after a word with no separator (``PGPASSWORD value``, ``passwd value``, ``mysql
-pPASSWORD``), each kind scanned only in text holding one of its words (``ass``, ``PWD``;
``mysql``, ``mariadb``).

A word after ``password``, ``passwd`` or ``PGPASSWORD`` and a space is masked only when it
holds a digit or a symbol, so prose (``the password field``, ``set PGPASSWORD before``) stays.
Their first letters are common ones, so a scan of their own behind a substring test keeps them
from slowing down every other text.
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


_QUERY_NAMES: Final = ("key", "apikey", "api_key", "api-key", "sig", "session", "auth")
"""URL query parameters whose value is a secret (``?key=``, an Azure SAS's ``&sig=``,
Firebase's ``?auth=``)."""

_QUERY_NAME_ENDINGS: Final = ("token", "signature", "secret", "sessionid")
"""URL query parameters whose value is a secret, alone or after a prefix
(``?token=``, ``&X-Amz-Security-Token=``, ``&X-Amz-Signature=``, ``&client_secret=``)."""

_LABEL_SCAN: Final = re.compile(
    # Run over the reversed text: a separator is rare where a label's first letter is not, so
    # starting from the separator lets the engine skip to candidates in C.
    r"[:=>](?:(?<=>)=|(?<==):?|(?<=:))[ \t]*(?:[\"']\\?)?"
    r"(?i:(noitazirohtua)|(eikooc)|(?<==)(edoc)[?&]|"
    + "|".join(_reversed_label(label) for label in _LABELS)
    + r"|(?<==)(?:"
    + "|".join(re.escape(name[::-1]) for name in _QUERY_NAMES)
    + r")[?&]|(?<==)(?:"
    + "|".join(name[::-1] for name in _QUERY_NAME_ENDINGS)
    + r")(?:[_.-][A-Za-z0-9_.-]*)?[?&])"
    r"(?![\w.-]*//:)"
)
"""A separator, then (reversed) a label, ``Authorization``, ``Cookie``, a URL query
parameter naming a secret (right after ``?`` or ``&``), or the query's ``code`` before it.

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

_COOKIE_VALUE: Final = re.compile(
    r"[ \t]*(?:\\?[\"'])?" + _NOT_A_VALUE + r"""([^\s=;"'\\]+=[^\r\n"'\\]*)"""
)
"""The cookies after ``Cookie:`` or ``Set-Cookie:``, masked to the end of the line: every
``name=value`` pair is a session. A value without ``=`` (``Cookie: chocolate chip``) is prose."""

_CODE_VALUE: Final = re.compile(r"""(?=[^\s"'\\&#]{16})""" + _LABELLED_VALUE.pattern)
"""The value of a URL's ``?code=``: an Azure Functions key or an OAuth authorization code,
masked from 16 characters on, so an airport, a status or a promotion code stays readable."""

_HEADER_VALUES: Final = (_LABELLED_VALUE, _HEADER_VALUE, _COOKIE_VALUE, _CODE_VALUE)
"""The value pattern after a label (no group), ``Authorization`` (group 1), ``Cookie`` (2),
a query's ``code`` (3)."""


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
    for position, group in reversed(found):
        if position < read_until:
            continue
        value = _HEADER_VALUES[group or 0].match(text, position)
        if value is not None:
            into.append(_secret_span(value))
            read_until = value.end()


_CAMEL_CASE: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
"""Where camelCase starts a word: before a capital after a small letter or digit
(``apiKey``), and before the last capital of a run of them that a small letter follows
(``DBPassword`` is ``DB_Password``)."""
_SEPARATORS: Final = re.compile(r"[^a-z0-9]+")


def _normalised_key(name: str) -> str:
    """A key as the secret names are compared with it: ``X-Api-Key`` is ``x_api_key``."""
    return _SEPARATORS.sub("_", _CAMEL_CASE.sub("_", name).lower()).strip("_")


def parse_secret_keys(text: str, *, source: str = REDACT_KEYS_VARIABLE) -> tuple[str, ...]:
    """The key names of a comma-separated list (``ONWARD_REDACT_KEYS``), blanks skipped.

    Raises:
        ConfigurationError: A name has no letter or digit; the message names ``source``.
    """
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        if not _normalised_key(name.removeprefix("*")):
            raise ConfigurationError(
                f"{source}: {name!r} is not a key name; give comma-separated names such as "
                "ssn,*_pin"
            )
    return names


class _SecretKeys:
    """Which dict keys name a secret: exact names and ``*_suffix`` patterns, normalised."""

    __slots__ = ("exact", "suffixes")

    def __init__(self, names: Sequence[str]) -> None:
        if isinstance(names, str):
            raise ConfigurationError(
                f"secret_keys must be a sequence of key names, not the single string {names!r}; "
                f"pass ({names!r},)"
            )
        exact: set[str] = set()
        suffixes: set[str] = set()
        for name in names:
            if not isinstance(name, str) or not _normalised_key(name.removeprefix("*")):
                raise ConfigurationError(
                    f"secret key name {name!r} is not a key name; pass names such as "
                    "'ssn' or '*_pin' (any key ending in _pin)"
                )
            if name.startswith("*"):
                suffixes.add("_" + _normalised_key(name[1:]))
            else:
                exact.add(_normalised_key(name))
        self.exact = frozenset(exact)
        self.suffixes = tuple(sorted(suffixes))

    def match(self, key: str) -> bool:
        """Whether ``key`` names a secret."""
        normalised = _normalised_key(key)
        return normalised in self.exact or normalised.endswith(self.suffixes)


_TOKENS: Final = _Scan(_TOKEN_PATTERNS)
_CONTEXTS: Final = _Scan(_CONTEXT_PATTERNS)
_SPACED_PASSWORDS: Final = _Scan(_SPACED_PASSWORD_PATTERNS)
_MYSQL_PASSWORDS: Final = _Scan(_MYSQL_PASSWORD_PATTERNS)


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


def window_to_mask(text: str, chars: int) -> str:
    """The first ``chars`` characters of ``text``, for masking before a message is cut from
    them: a text masked whole may be megabytes, and one cut first may split a secret into text
    no pattern knows (a URL cut between its password and its ``@``). When the window is short
    of the text, the word its end falls in is left out, unless it is all there is."""
    window = text[:chars]
    if len(window) < len(text):
        window = _CUT_WORD.sub("", window)
    return window


_CUT_WORD: Final = re.compile(r"(?<=\s)\S+\Z")
"""The last word of a text cut short, when white space comes before it."""


class Redactor:
    """Masks secrets in text, in JSON-like values and in events.

    A redactor is immutable once built and safe to share between tasks and threads.

    Args:
        extra_patterns: Regular expressions for secrets of shapes the built-in patterns do not
            know (an internal token format, employee ids). A match is masked whole, or only its
            group named ``secret`` when the pattern has one.
        secret_keys: Dict key names whose whole value is masked, added to
            `DEFAULT_SECRET_KEYS` (``"ssn"``; ``"*_pin"`` for any key ending in ``_pin``).
            ``None`` (the default) takes them from ``ONWARD_REDACT_KEYS``, comma-separated, so
            every redactor a runner builds by default honours the deployment's setting.
        enabled: ``False`` makes every method return its argument untouched. Only for stores
            already trusted with the secrets themselves; refused with ``ENVIRONMENT=prod``.
        mask: What each secret is replaced with.

    Raises:
        ConfigurationError: An extra pattern does not compile, is a bytes pattern, or matches
            the empty string; a secret key name (or ``ONWARD_REDACT_KEYS``) holds no letter or
            digit. The message names the pattern or the name. ``enabled=False`` with
            ``ENVIRONMENT=prod``.
    """

    __slots__ = (
        "_enabled",
        "_extras",
        "_mask",
        "_masked_key",
        "_min_length",
        "_names_secret",
        "_secret_keys",
    )

    def __init__(
        self,
        *,
        extra_patterns: Sequence[str | re.Pattern[str]] = (),
        secret_keys: Sequence[str] | None = None,
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
        if secret_keys is None:
            secret_keys = parse_secret_keys(os.environ.get(REDACT_KEYS_VARIABLE, ""))
        elif isinstance(secret_keys, str):
            _SecretKeys(secret_keys)  # raises, naming the single string
        self._secret_keys = _SecretKeys((*DEFAULT_SECRET_KEYS, *secret_keys))
        if not enabled:
            refuse_disabled_redaction()
        self._enabled = enabled
        self._mask = mask
        self._min_length = 1 if self._extras else _SHORTEST_SECRET
        # Keys repeat across values (every result of a tool has the same ones), so what a key
        # means is worked out once per distinct key, in bounded caches. Typed, since ``True``,
        # ``1`` and ``1.0`` are equal keys: one must not be handed back for another.
        self._names_secret: Callable[[Any], bool] = functools.lru_cache(maxsize=4096, typed=True)(
            self._judge_key_name
        )
        self._masked_key: Callable[[Any], Any] = functools.lru_cache(maxsize=4096, typed=True)(
            self._judge_key_text
        )

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
            # Scanned only in text holding their words: their first letters are common ones.
            if "ass" in text or "ASS" in text or "PWD" in text:
                _SPACED_PASSWORDS.spans(text, spans)
            if "mysql" in text or "mariadb" in text:
                _MYSQL_PASSWORDS.spans(text, spans)
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

    def is_secret_key(self, key: str) -> bool:
        """Whether a dict key names a secret, so that its whole value is masked."""
        return self._names_secret(key)

    def redact(self, value: Any) -> Any:
        """Mask every secret in a JSON-like value.

        Strings are masked; lists, tuples, sets and dicts are walked; msgspec Structs are walked
        field by field (an event's envelope is kept); a dataclass or attrs instance, which the
        log writes as an object of its fields, comes back as that object (a dict) masked. A dict
        key naming a secret has its whole value masked (strings and numbers, nested ones
        included); a dict key holding a secret is masked itself. Binary values and every other
        leaf are returned untouched. Values nested any number of levels deep are walked without
        recursion.

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
        walked: _EventT = self._walk(event)
        return walked

    def _judge_key_name(self, key: Any) -> bool:
        """Whether a dict key names a secret (only a string can)."""
        return isinstance(key, str) and self._secret_keys.match(key)

    def _judge_key_text(self, key: Any) -> Any:
        """A dict key with any secret in its text masked; the same object if it holds none."""
        return self.redact_text(key) if isinstance(key, str) else key

    def _leaf(self, value: Any, secret: bool) -> Any:
        """A value that is no container, masked: its secrets, or all of it under a secret key."""
        if isinstance(value, str):
            if secret:
                return value if not value or value == self._mask else self._mask
            return self.redact_text(value)
        if secret and isinstance(value, _MASKED_WHOLE) and not isinstance(value, bool):
            # A numeric PIN or password is a secret too, and so is a Decimal (a NUMERIC column)
            # or a UUID (a session id), written as their text. None, booleans and binary
            # values are kept: they hold no secret, or one no pattern can honestly mask.
            return self._mask
        fields = _fields_of(value)
        if fields is not None:
            # Written as an object of its fields, so masked as that object would be; the very
            # same value when nothing in it was masked.
            walked = self._walk(fields, secret)
            return value if walked is fields else walked
        return value

    def _walk(self, value: Any, secret: bool = False, depth: int = 0) -> Any:
        """Mask the strings inside ``value``, recursing while it is shallow (as fast as a walk
        goes); past `_RECURSION_DEPTH` levels `_walk_deep` takes the rest, with its own stack.

        ``secret``: the value is under a key naming a secret, so all of it is masked.
        """
        if isinstance(value, str) and not secret:
            return self.redact_text(value)  # the most common value of all, without a call more
        if not isinstance(value, _CONTAINERS):
            return self._leaf(value, secret)
        if depth >= _RECURSION_DEPTH:
            return self._walk_deep(value, secret)
        depth += 1
        changes: dict[Any, Any] = {}
        if isinstance(value, dict):
            renamed = self._renamed_keys(value)
            names_secret = self._names_secret
            for key, item in value.items():
                new = self._walk(item, secret or names_secret(key), depth)
                if new is not item:
                    changes[key] = new
            return _rebuilt_dict(value, changes, renamed)
        if isinstance(value, msgspec.Struct):
            for name in _walked_names(type(value)):
                old = getattr(value, name)
                new = self._walk(old, secret, depth)
                if new is not old:
                    changes[name] = new
            return _rebuilt(value, changes)
        for index, item in enumerate(value):
            new = self._walk(item, secret, depth)
            if new is not item:
                changes[index] = new
        return _rebuilt(value, changes)

    def _renamed_keys(self, value: dict[Any, Any]) -> dict[Any, Any]:
        """The keys of ``value`` whose text holds a secret, each with its masked text."""
        keys = value.keys()
        masked_key = self._masked_key
        if not any(map(is_not, map(masked_key, keys), keys)):
            return {}
        return {key: masked_key(key) for key in keys if masked_key(key) is not key}

    def _walk_deep(self, root: Any, secret: bool) -> Any:
        """Walk a deep container with a stack of frames (a list) instead of recursion.

        A container already being walked further up is not walked into again, so a value
        holding itself ends instead of growing the stack for ever.
        """
        frame = self._open(root, secret)
        stack: list[_Frame] = []
        walking = {id(root)}
        while True:
            deeper: _Frame | None = None
            for slot, child, child_secret in frame.children:
                if isinstance(child, _CONTAINERS):
                    if id(child) not in walking:
                        frame.slot = slot
                        deeper = self._open(child, child_secret)
                        break
                    continue
                new = self._leaf(child, child_secret)
                if new is not child:
                    frame.changes[slot] = new
            if deeper is not None:
                stack.append(frame)
                walking.add(id(deeper.value))
                frame = deeper
                continue
            result = frame.result()
            if not stack:
                return result
            walking.discard(id(frame.value))
            walked_value = frame.value
            frame = stack.pop()
            if result is not walked_value:
                frame.changes[frame.slot] = result

    def _open(self, value: Any, secret: bool) -> _Frame:
        """A frame walking the children of a container or a Struct, as `_walk` does."""
        if isinstance(value, dict):
            keys = value.keys()
            secrets = repeat(True) if secret else map(self._names_secret, keys)
            children = zip(keys, value.values(), secrets, strict=False)
            return _Frame(value, children, renamed=self._renamed_keys(value))
        if isinstance(value, msgspec.Struct):
            names = _walked_names(type(value))
            return _Frame(value, ((name, getattr(value, name), secret) for name in names))
        return _Frame(value, zip(count(), value, repeat(secret)))


_CONTAINERS: Final = (dict, list, tuple, set, frozenset, msgspec.Struct)

_MASKED_WHOLE: Final = (int, float, decimal.Decimal, uuid.UUID)
"""Leaves besides strings masked whole under a key naming a secret (booleans excepted)."""

_KEPT_AS_THEY_ARE: Final = (
    bytes,
    bytearray,
    memoryview,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
    decimal.Decimal,
)
"""Leaves `_fields_of` leaves as they are: binary values stay unmasked (and unscanned), and
the others hold no secret."""


def _fields_of(value: Any) -> dict[str, Any] | None:
    """A dataclass or attrs instance as the dict of fields msgspec writes it as (its nested
    values as plain ones), or ``None`` for any other value or one msgspec cannot write (the
    encoder then refuses it, naming it)."""
    kind = type(value)
    if not (dataclasses.is_dataclass(kind) or hasattr(kind, "__attrs_attrs__")):
        return None
    try:
        fields: dict[str, Any] = msgspec.to_builtins(
            value, builtin_types=_KEPT_AS_THEY_ARE, str_keys=False
        )
    except (TypeError, ValueError, OverflowError):
        return None
    return fields


_RECURSION_DEPTH: Final = 64
"""How deep `Redactor._walk` recurses before `Redactor._walk_deep` takes over: deeper than
the values events hold, and far below the interpreter's recursion limit."""


@functools.cache
def _walked_names(struct_type: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of a Struct type that are walked: all but an event's envelope."""
    keep = _ENVELOPE if issubclass(struct_type, Event) else frozenset()
    return tuple(name for name in _field_names(struct_type) if name not in keep)


def _rebuilt(value: Any, changes: dict[Any, Any]) -> Any:
    """A Struct, list, tuple, set or frozenset with ``changes`` (by field or index): the very
    same object when there are none, else a Struct replaced field by field or a collection
    copied as its own kind."""
    if not changes:
        return value
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.replace(value, **changes)
    copy = list(value)
    for index, new in changes.items():
        copy[index] = new
    if isinstance(value, list):
        return copy
    return tuple(copy) if isinstance(value, tuple) else type(value)(copy)


def _rebuilt_dict(value: dict[Any, Any], changes: dict[Any, Any], renamed: dict[Any, Any]) -> Any:
    """A dict with ``changes`` (by key) and its ``renamed`` keys masked; the very same object
    when there are neither. Two keys masked to the same text are kept distinct by a ``#2``,
    ``#3`` suffix, so no value is lost."""
    if not renamed:
        if not changes:
            return value
        copy = dict(value)
        copy.update(changes)
        return copy
    taken = {key for key in value if key not in renamed}
    rebuilt: dict[Any, Any] = {}
    for key, item in value.items():
        new_key = key
        if key in renamed:
            new_key = masked = renamed[key]
            number = 1
            while new_key in taken:
                number += 1
                new_key = f"{masked}#{number}"
            taken.add(new_key)
        rebuilt[new_key] = changes.get(key, item)
    return rebuilt


class _Frame:
    """One container `Redactor._walk_deep` is walking: its children still to see and what
    changed so far.

    Children come as ``(slot, value, whether the value is a secret)``; ``slot`` is an index, a
    dict key or a field name. ``renamed``: a dict's keys whose text was masked.
    """

    __slots__ = ("changes", "children", "renamed", "slot", "value")

    def __init__(
        self,
        value: Any,
        children: Iterator[tuple[Any, Any, bool]],
        *,
        renamed: dict[Any, Any] | None = None,
    ) -> None:
        self.value = value
        self.children = children
        self.renamed = renamed
        self.changes: dict[Any, Any] = {}
        self.slot: Any = None

    def result(self) -> Any:
        """The container with its changes, as `Redactor._walk` builds it."""
        if self.renamed is not None:
            return _rebuilt_dict(self.value, self.changes, self.renamed)
        return _rebuilt(self.value, self.changes)


__all__ = [
    "DEFAULT_MASK",
    "DEFAULT_SECRET_KEYS",
    "REDACT_KEYS_VARIABLE",
    "Redactor",
    "window_to_mask",
]
