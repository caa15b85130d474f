"""The one exception a user should ever see, and how an entry script turns it into an exit code.

Bad input (a misspelt flag, a missing column, an unknown task) must end with one line that names
the problem and the fix, never a traceback from deep inside a library. Library code raises
`UsageError`; `run_cli` prints its message once and exits with code 2, like argparse does.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

EXIT_USAGE = 2


class UsageError(ValueError):
    """A problem with what the user asked for. The message says what to do instead."""


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Runs `main(argv)`; a `UsageError` becomes one line on stderr and exit code 2."""
    try:
        main(argv)
    except UsageError as err:
        # Under `accelerate launch` every process hits the same error: print it once.
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return 0
