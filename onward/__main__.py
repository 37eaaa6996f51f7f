"""`python -m onward` and the `onward` command.

The command's code is imported inside `main`, not before it: the import takes a second or more,
and a Ctrl-C in it would otherwise end the command with a traceback instead of the one line and
exit 130 a Ctrl-C gets at any later moment.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130
"""The exit code of a command ended by Ctrl-C, as the CLI's own."""


def main() -> None:
    """Entry point of the `onward` console script and of `python -m onward`."""
    try:
        from onward.runtime.cli import main as command  # noqa: PLC0415 - Ctrl-C in it is said
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    command()


if __name__ == "__main__":
    main()
