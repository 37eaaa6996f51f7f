"""What every command shares: the consoles, the exit codes and the one boundary that picks them.

Every command runs inside `boundary`, which turns whatever stopped it into one line on standard
error and the documented exit code; no traceback reaches the person at the terminal. Driver
exceptions that still reach the command line unconverted are translated here with
`onward.errors.translate`, so they are reported like every other store failure. Standard
output closed by its reader (``onward replay RUN --json | head -1``) is a normal end, exit 0:
results are written through `out` and `echo`, which tell that apart from a server's socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import inspect
import json
import logging
import os
import pkgutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import IO, TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar, cast

import typer
from rich.console import Console
from rich.text import Text

from onward import errors
from onward._storage import classify, one_line_driver_logs, translate
from onward.errors import ConfigurationError, InvalidInputError, OnwardError
from onward.eventlog.references import is_reference, unescaped
from onward.projections.audit import one_line, printable, printable_json, shell_word
from onward.projections.frontier import CallState

if TYPE_CHECKING:
    # The settings load pydantic-settings: a command's ``--help`` reads none.
    from onward.runtime.settings import Settings

_P = ParamSpec("_P")
_T = TypeVar("_T")

EXIT_OK = 0
"""Done; for `run --resume`, carried on or nothing to do."""
EXIT_NO_RUN = 1
"""No run under that id for that tenant."""
EXIT_USAGE = 2
"""The command line (or the configuration) cannot be used; typer's own usage errors are 2 too."""
EXIT_HELD = 3
"""Another worker holds the run's lease (or took it over while this command held it)."""
EXIT_MUST_NOT_CARRY_ON = 4
"""The run must not be carried on as it is: a person or an upgrade has to act first."""
EXIT_FAILED = 5
"""A store, the model or the agent's code failed; nothing was decided about the run."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (SIGINT), the shell's convention."""
EXIT_TERMINATED = 143


class TerminatedError(Exception):
    """The command was sent SIGTERM (``timeout``, systemd, Docker, Kubernetes): it stopped as
    on Ctrl-C, its run's lease handed back."""


KAFKA_MAX_MS = 2**31 - 1
"""The most milliseconds a Kafka request's field holds (a signed 32-bit integer): a session
timeout or a fetch's wait beyond it fails inside the client, every time it is sent."""

CONNECT_TIMEOUT_S = 20.0
"""How long opening the stores may take, at least, before a command gives up on a server that
is silent; when ``ONWARD_BACKEND_TIMEOUT`` and `CONNECT_GRACE_S` make more, that is waited
instead (`connect_timeout_s`)."""

CONNECT_GRACE_S = 2.0
"""How much longer than ``ONWARD_BACKEND_TIMEOUT`` opening the stores may take: a silent store
then gives up on its own bound first and names its server and address, where a bound firing at
the same moment would have said only "one of Kafka, PostgreSQL and Redis did not answer"."""

SAY_WAIT_AFTER_S = 5.0
"""How long opening a store waits for it before saying so: a server that takes the connection
and never answers would otherwise keep a command silent until the whole bound has passed."""


class OutputClosedError(Exception):
    """Standard output's reader went away (``| head -1``): the command stops, exit 0.

    Not an `OSError`, so the boundary cannot take it for a server that did not answer.
    """


class _Stdout:
    """Standard output as it is now (a test runner swaps it), a closed pipe raising
    `OutputClosedError` instead of `BrokenPipeError`."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except BrokenPipeError as exc:
            raise OutputClosedError from exc

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError as exc:
            raise OutputClosedError from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stdout, name)


_stdout = cast(IO[str], _Stdout())
err = Console(stderr=True)
"""Errors and progress go to standard error."""
out = Console(file=_stdout, highlight=False)
"""Results go to standard output, so they can be piped."""


def echo(text: str, *, nl: bool = True) -> None:
    """Write ``text`` to standard output as it is (a JSON line, the schema), never re-wrapped."""
    _stdout.write(text + ("\n" if nl else ""))
    _stdout.flush()


def echo_json(value: Any) -> None:
    """One JSON object on one line of standard output: what ``--json`` prints, with run
    content that could drive a terminal as JSON escapes (`printable_json`)."""
    echo(printable_json(value))


JsonResultOption = Annotated[
    bool, typer.Option("--json", help="Print the result as one JSON object instead of text.")
]


def _discard_stdout() -> None:
    """Point standard output at the null device, so the interpreter's last flush of what is
    still buffered does not fail again on the closed pipe and print a warning."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return  # not a file descriptor (a test runner's buffer): nothing is flushed at exit
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]
TenantOption = Annotated[
    str,
    typer.Option("--tenant", "-t", help="The tenant that owns the run.", show_default=True),
]


def _archive_directory(value: str) -> Path:
    """``--archive`` as a directory path. An empty one is refused: it would be the working
    directory, so ``--archive "$ARCHIVE"`` with the variable unset archived wherever the
    command ran."""
    if not value:
        raise typer.BadParameter(
            "must not be empty; give the archive's directory (an unset shell variable leaves "
            "it empty)"
        )
    path = Path(value)
    if path.is_file():
        raise typer.BadParameter(f"{value} is a file; give a directory")
    return path


ArchiveOption = Annotated[
    Path | None,
    typer.Option(
        "--archive",
        metavar="DIR",
        help="The directory archive of cut log records (compact writes it, others read it).",
        parser=_archive_directory,
    ),
]


def exit_code(exc: OnwardError) -> int:
    """The documented exit code of an error, so scripts can tell outcomes apart."""
    if isinstance(exc, errors.NothingToResumeError):
        return EXIT_NO_RUN
    if isinstance(exc, InvalidInputError | ConfigurationError):
        return EXIT_USAGE
    if isinstance(exc, errors.ResumeConflictError | errors.FencedError):
        return EXIT_HELD
    if isinstance(
        exc,
        errors.IndeterminateToolCallError
        | errors.BudgetExceededError
        | errors.HistoryUnavailableError
        | errors.RevisionMismatchError
        | errors.EventDecodeError
        | errors.LogTruncatedError,
    ):
        return EXIT_MUST_NOT_CARRY_ON
    return EXIT_FAILED


def error(message: str) -> None:
    """One line on stderr, never re-wrapped, so a command in it can be copied whole; control
    characters a run's content put in it (a holder's name, a call id) are shown escaped."""
    err.print(Text(printable(message), style="red"), soft_wrap=True)


def resolve_commands(run_id: str, tenant: str, call: CallState) -> list[str]:
    """The two `onward resolve` commands that settle an undecided call, ready to fill in."""
    base = (
        f"onward resolve {shell_word(run_id)} {shell_word(call.call_id)} "
        f"--tenant {shell_word(tenant)}"
    )
    return [
        f"{base} --outcome completed --result JSON --by NAME --why REASON",
        f"{base} --outcome never_ran --by NAME --why REASON",
    ]


def _arguments(call: CallState) -> str:
    """A call's arguments as the model gave them, in short: ones the log holds out of line
    are said to be in the blob store (their reference names only a digest), and a value
    wrapped because it looked like a reference is shown as it was."""
    if is_reference(call.args):
        return f"args in the blob store, {printable(str(call.args['size']))} bytes"
    return f"args {one_line(unescaped(call.args))}"


def refuse(exc: OnwardError, *, tenant: str | None) -> int:
    """Say on stderr in one line why the command stopped, and pick its exit code.

    Undecided calls are the one case with more to say: each call, and the `onward resolve`
    commands that settle it, follow the error line.
    """
    error(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, errors.IndeterminateToolCallError) and exc.run_id and tenant is not None:
        error("undecided calls; find out whether each took effect, then settle it with one of:")
        for call in exc.calls:
            error(
                f"  {call.call_id} ({call.tool}, key {call.idempotency_key or 'none'}, "
                f"dispatched under fence {call.dispatched_fence}, {_arguments(call)})"
            )
            for command in resolve_commands(exc.run_id, tenant, call):
                error(f"    {command}")
    return exit_code(exc)


@dataclass
class _Debugging:
    """Whether ``onward --debug`` was given: set by the root command for the command it runs."""

    on: bool = False


debugging = _Debugging()


def boundary(command: Callable[_P, None], *, name: str) -> Callable[_P, None]:
    """Wrap the command ``name`` so every way it can stop becomes its documented exit code.

    `OnwardError` picks its code with `exit_code`; a driver exception is translated first;
    any other exception is the agent's or the model's own code failing (exit 5, with its
    traceback first under ``onward --debug``); Ctrl-C is 130.
    Each says so in one line on standard error. Standard output closed by its reader ends the
    command quietly, exit 0, as it does for ``cat`` or ``grep``.
    """

    @functools.wraps(command)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> None:
        # aiokafka logs every refused connection before raising it; the error line says it once.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        one_line_driver_logs()
        tenant = kwargs.get("tenant")
        try:
            command(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except OutputClosedError as exc:
            _discard_stdout()
            raise typer.Exit(EXIT_OK) from exc
        except OnwardError as exc:
            code = refuse(exc, tenant=tenant if isinstance(tenant, str) else None)
            raise typer.Exit(code) from exc
        except KeyboardInterrupt as exc:
            # A run is cancelled cleanly (its lease handed back); click would say 1, "no such run".
            error("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from exc
        except TerminatedError as exc:
            # As "interrupted": most commands hold no run, and one that does hands it back.
            error("terminated")
            raise typer.Exit(EXIT_TERMINATED) from exc
        except Exception as exc:
            if classify(type(exc)) is not None:
                translated = translate(exc, context=name)
                raise typer.Exit(refuse(translated, tenant=None)) from exc
            if debugging.on:
                for line in "".join(traceback.format_exception(exc)).splitlines():
                    err.print(Text(printable(line)), soft_wrap=True)
            error(f"{type(exc).__name__} (raised by the agent's or the model's code): {exc}")
            raise typer.Exit(EXIT_FAILED) from exc
        finally:
            debugging.on = False  # for this command only; the next one says again

    return guarded


def run_until_terminated(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)``, with SIGTERM handled as Ctrl-C is: the work is cancelled, so a
    run it holds hands its lease back on the way out instead of staying locked for the ttl.

    Raises:
        TerminatedError: SIGTERM arrived (exit 143 at the command boundary).
    """
    terminated = False

    async def cancellable() -> _T:
        nonlocal terminated
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        if threading.current_thread() is not threading.main_thread():
            return await main  # signals reach the main thread only (a command run by a test)
        # Put back afterwards: `frontier_main` and `resume_main` run inside a product's process.
        previous = signal.getsignal(signal.SIGTERM)
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            if previous is not None:  # None: set outside Python, and cannot be put back
                signal.signal(signal.SIGTERM, previous)

    try:
        return asyncio.run(cancellable())
    except asyncio.CancelledError as exc:
        if terminated:
            raise TerminatedError from exc
        raise


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What stops a long-lived command (`onward worker`, `onward projector`)."""


class _StoppedBeforeLoopError(BaseException):
    """A stop signal before the event loop handled them. Not an `Exception`, as
    `KeyboardInterrupt` is not: the import of a user's module catches ``Exception`` (`imported`),
    as the module itself may, and would turn the stop into a failed import (exit 2)."""


@contextlib.contextmanager
def stopped_before_the_loop(said: str) -> Iterator[None]:
    """SIGTERM and SIGINT end the block with ``said`` (exit 0) until an event loop takes them
    over; the handlers before it are put back after.

    A long-lived command imports the user's modules before its loop runs (``--agent``,
    ``--projection``), and one that loads a model or connects on import takes a while: SIGTERM
    meanwhile killed the process with no line and no exit code of its own, Ctrl-C said
    "interrupted", 130, where a stop of the same command a moment later says it stopped, 0.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only (a command run by a test)
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise _StoppedBeforeLoopError

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    except _StoppedBeforeLoopError:
        err.print(said)
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, and cannot be put back
                signal.signal(sig, handler)


def connect_timeout_s() -> float:
    """How long opening the stores may take: `CONNECT_TIMEOUT_S`, or the configured backend
    timeout and `CONNECT_GRACE_S` when that is longer (a slow network given a minute is not cut
    off at twenty seconds); the settings are checked before any store is opened, so reading
    them here cannot fail on a bad value first."""
    from onward.runtime.settings import load_settings  # noqa: PLC0415 - see TYPE_CHECKING

    try:
        configured = load_settings().backend_timeout
    except ConfigurationError:
        configured = 0.0
    return max(CONNECT_TIMEOUT_S, configured + CONNECT_GRACE_S)


def frontier_server(config: Settings) -> str:
    """The server that holds ``config``'s frontier rows, as a message names it: the backend's
    name sent the reader of "the kafka frontier store did not answer" to Kafka, where it was
    PostgreSQL (or Redis) that did not."""
    if config.backend == "kafka" and config.frontier_store == "redis":
        return "Redis (REDIS_URL)"
    if config.backend in ("kafka", "postgres"):
        return "PostgreSQL (DATABASE_URL)"
    return f"the {config.backend} frontier store"


def backend_servers(config: Settings) -> str:
    """The servers `open_backends` opens for ``config``, as a message names them: "the kafka
    stores did not answer" sent the reader to Kafka where PostgreSQL or Redis may not have."""
    if config.backend == "postgres":
        return "PostgreSQL (DATABASE_URL)"
    if config.backend != "kafka":
        return f"the {config.backend} stores"
    servers = ["Kafka (KAFKA_BOOTSTRAP_SERVERS)", "PostgreSQL (DATABASE_URL)"]
    if config.redis_url or config.frontier_store == "redis":
        servers.append("Redis (REDIS_URL)")
    return f"one of {', '.join(servers[:-1])} and {servers[-1]}"


async def within(step: Awaitable[_T], what: str) -> _T:
    """Await one connecting step, giving up on a server that does not answer in time."""
    bound = connect_timeout_s()
    until = time.strftime("%H:%M:%S UTC", time.gmtime(time.time() + bound))
    saying = asyncio.get_running_loop().call_later(
        SAY_WAIT_AFTER_S,
        lambda: err.print(
            f"waiting for {what} to answer; waits until {until} ({bound:g} s: "
            f"ONWARD_BACKEND_TIMEOUT and {CONNECT_GRACE_S:g} s more, never less than "
            f"{CONNECT_TIMEOUT_S:g} s while connecting), "
            "then gives up",
            soft_wrap=True,
            highlight=False,
            markup=False,
        ),
    )
    try:
        async with asyncio.timeout(bound):
            return await step
    except TimeoutError as exc:
        raise errors.BackendUnavailableError(
            f"{what} did not answer within {bound:g}s; check that it is up and reachable"
        ) from exc
    finally:
        saying.cancel()


@contextlib.asynccontextmanager
async def opened(
    what: str, stores: contextlib.AbstractAsyncContextManager[_T]
) -> AsyncIterator[_T]:
    """Enter ``stores`` with a bounded connect time, then hand them over for as long as needed."""
    async with contextlib.AsyncExitStack() as stack:
        yield await within(stack.enter_async_context(stores), what)


def checked_sqlite_directory(config: Settings) -> Settings:
    """``config``, once its SQLite file's directory is found: no file can be made in one that
    is not there, and the driver's "unable to open database file" would reach the person as
    a store that did not answer (exit 5, retry), which no retry mends.

    Raises:
        ConfigurationError: Naming ``ONWARD_SQLITE_PATH`` and the directory.
    """
    directory = config.sqlite_path.parent
    if config.backend == "sqlite" and not directory.is_dir():
        raise ConfigurationError(
            f"ONWARD_SQLITE_PATH {str(config.sqlite_path)!r}: its directory {str(directory)!r} "
            "does not exist; create it, or point ONWARD_SQLITE_PATH at a file in one that does"
        )
    return config


def imported(spec: str, option: str) -> object:
    """What ``package.module:attribute`` or ``path/to/file.py:attribute`` names.

    A module name is looked up on the import path only. The working directory is not searched
    for it: a name such as ``agents`` would otherwise import whatever ``agents.py`` lies in the
    directory the command happens to run in. A file of one's own is named as a file
    (``agents.py:booker``, ``./app/agents.py:booker``); its directory is then put on the import
    path, so that it can import the modules next to it, as ``python agents.py`` would.

    Raises:
        InvalidInputError: ``spec`` is malformed or names nothing importable (exit 2).
    """
    module_name, colon, attribute = spec.rpartition(":")
    if not module_name or not colon or not attribute:
        raise InvalidInputError(
            f"{option}: {spec!r} must look like package.module:attribute or file.py:attribute"
        )
    try:
        if module_name.endswith(".py"):
            return functools.reduce(getattr, attribute.split("."), _module_file(module_name))
        return pkgutil.resolve_name(spec)
    except Exception as exc:
        hint = ""
        top = module_name.partition(".")[0]
        if isinstance(exc, ModuleNotFoundError) and exc.name == top and Path(f"{top}.py").is_file():
            hint = (
                f" (the working directory is not searched; to use ./{top}.py, name the file: "
                f"{top}.py:{attribute})"
            )
        raise InvalidInputError(
            f"{option}: cannot import {spec!r}: {type(exc).__name__}: {exc}{hint}"
        ) from exc


def _module_file(path_text: str) -> ModuleType:
    """The module in the file ``path_text``, loaded once under its file name's stem."""
    path = Path(path_text).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no file {path_text}")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path_text} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module


def made(found: object, spec: str, option: str, *, is_made: Callable[[object], bool]) -> object:
    """``found`` if it already is what the option wants, else what calling it returns."""
    if is_made(found) or not callable(found):
        return found
    try:
        return found()
    except Exception as exc:
        raise InvalidInputError(f"{option}: {spec} raised {type(exc).__name__}: {exc}") from exc


def text_option(text: str, option: str) -> str:
    """An option's text as given, or read from the file ``@PATH`` or from standard input
    (``-``), for text too long for a command line ("Argument list too long")."""
    return _read_option(text, option)[0]


def json_option(text: str | None, option: str) -> Any:
    """Decode a JSON option before anything is opened, so bad input writes nothing.

    ``@PATH`` reads the JSON from the file ``PATH`` and ``-`` from standard input, for values
    too long for a command line ("Argument list too long") or made by another program.
    """
    if text is None:
        return None
    text, where = _read_option(text, option)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(f"{option}: not JSON{where}: {exc}") from exc


def _read_option(text: str, option: str) -> tuple[str, str]:
    """The text an option stands for, and where it was read from (for error messages)."""
    if text == "-":
        return sys.stdin.read(), " (standard input)"
    if not text.startswith("@"):
        return text, ""
    path = text[1:]
    try:
        return Path(path).read_text(encoding="utf-8"), f" (file {path!r})"
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(
            f"{option}: cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}"
        ) from exc


def help_paragraphs(doc: str | None) -> list[str]:
    """A command's docstring as its ``--help`` shows it: paragraphs, each one line for the
    terminal to wrap (typer's rich help would keep the docstring's line breaks, which then
    fall mid-sentence at any other width); the first is its line in its group's list."""
    if not doc:
        return []
    return [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n") if p.strip()]
