"""`python -m onward`: the same as the `onward` command."""

from onward.runtime.cli import main

main()
