"""The exceptions a user may see, and how an entry script turns them into exit codes.

Bad input (a misspelt flag, a missing column, an unknown task) must end with one line that names
the problem and the fix, never a traceback from deep inside a library. Library code raises one
of the `CliError`s below; `run_cli` prints its message once and exits with the error's code:

    0   finished
    2   bad input (UsageError), like argparse; nothing was written. Also a checkpoint or export
        that could not be written (WriteError: a full disk): the ones written before are intact
    3   training diverged (DivergedError): the loss stayed non-finite; no NaN weights were saved
    75  preempted (Preempted): a checkpoint was saved; rerun with --resume_from_checkpoint auto.
        75 is sysexits' EX_TEMPFAIL ("try again later"), which the Slurm scripts requeue on.
    130 interrupted by Ctrl-C (Interrupted: a checkpoint was saved, as for 75; or, at a second
        Ctrl-C or outside training, KeyboardInterrupt: stopped at once, checkpoints saved before intact)
"""
from __future__ import annotations

import errno
import gc
import os
import signal
import sys
import time
from typing import Callable, Sequence

from t5_training import teardown

EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


class CliError(Exception):
    """An error that ends a run with one line and `exit_code`."""

    exit_code = 1
    prefix = "error"
    # True where every process raises it after the same step, from values they all-reduced.
    raised_by_every_process = False

    def __init__(self, message: str = ""):
        # One line whatever the message quotes: a column name or a cell from a user's file may
        # hold line breaks, which would otherwise split the error over several lines.
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


class UsageError(CliError, ValueError):
    """A problem with what the user asked for. The message says what to do instead."""

    exit_code = EXIT_USAGE


class DivergedError(CliError, RuntimeError):
    """The loss was non-finite for too many steps in a row. The message names the likely cause."""

    exit_code = EXIT_DIVERGED
    prefix = "diverged"
    raised_by_every_process = True


class WriteError(CliError):
    """A checkpoint, export or results file could not be written (a full disk, a read-only folder).

    Raised on every process once they agree (see checkpoint.save_checkpoint); what was being
    written is removed, and earlier checkpoints are intact, so the run resumes after the user
    frees space. Exit code 2: like bad input, the fix is the user's.
    """

    exit_code = EXIT_USAGE
    raised_by_every_process = True


class Preempted(CliError):
    """A SIGTERM or SIGUSR1 arrived; the run saved a checkpoint and stops so it can be requeued."""

    exit_code = EXIT_PREEMPTED
    prefix = "preempted"
    raised_by_every_process = True


class Interrupted(Preempted):
    """Ctrl-C (SIGINT) arrived; the run saved a checkpoint and stops. Not requeued: the user asked."""

    exit_code = EXIT_INTERRUPTED
    prefix = "interrupted"


def first_line(err: BaseException) -> str:
    """The first line of `err`'s message, for the one line a user sees; its kind where it has no message."""
    lines = str(err).strip().splitlines()
    return lines[0].strip() if lines else type(err).__name__


def run_cli(main: Callable[[Sequence[str] | None], object], argv: Sequence[str] | None = None) -> int:
    """Runs `main(argv)`; a `CliError` becomes one line on stderr and its exit code."""
    try:
        main(argv)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A write outside the checkpoint code (a results file, a plot) hit a full disk.
        if _main_process():
            print(f"error: no space left on device writing {err.filename or 'a file'}; free space and rerun with "
                  "--resume_from_checkpoint auto (checkpoints saved before are intact)", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C outside the training loop, or a second one inside it: no traceback, and nothing
        # half-written counts (checkpoints and exports are renamed into place once complete).
        if _main_process():
            print("interrupted: stopped at once (Ctrl-C), without saving; what was written before is intact, and "
                  "a training run continues from its newest checkpoint with --resume_from_checkpoint auto",
                  file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except CliError as err:
        # Under `accelerate launch` every process hits the same error: print it once.
        main_process = _main_process()
        if main_process:
            print(f"{err.prefix}: {err}", file=sys.stderr, flush=True)
        if err.raised_by_every_process:
            _close_process_group()
        elif not main_process and teardown.initialized_distributed() is None:
            _wait_for_the_launcher()
        return err.exit_code
    finally:
        # main()'s frame, and the model in it, is gone: the process group can end now (teardown).
        teardown.release_process_group()
        _skip_the_last_collection()
    return 0


def _main_process() -> bool:
    """Whether this process prints the run's one line: under `accelerate launch` every process meets the error."""
    return os.environ.get("RANK", "0") == "0"


def _skip_the_last_collection() -> None:
    """Lets the interpreter exit without walking every object torch and transformers made.

    Python's shutdown runs one last full garbage collection over the millions of objects that
    importing torch, transformers and datasets creates: about 2 s of a 2-core CPU at the end of
    every run, paid again by each process of `accelerate launch` and by every test that starts a
    script. Freezing them moves them out of the collector's reach; nothing left at this point
    needs it (the run has written, flushed and closed its files, and atexit handlers still run).
    """
    gc.freeze()


def _close_process_group() -> None:
    """Closes the process group that a run stopped by an error left open (end_training closes it otherwise).

    Left open at exit (DeepSpeed's especially), it can abort the interpreter with "terminate
    called without an active exception", turning exit code 75 into 134. Only done when every
    process raised the error at the same point: closing while another process still waits in
    a collective can hang.
    """
    distributed = teardown.initialized_distributed()
    if distributed is not None:
        # Leave together: a launcher that sees one process exit terminates the others, which would
        # then report SIGTERM instead of their own exit code.
        distributed.barrier()
        teardown.keep_process_group()
        distributed.destroy_process_group()


def _wait_for_the_launcher(seconds: float = 60.0) -> None:
    """Lets the main process, which prints the error, be the one whose exit ends the launch.

    An error met before the process group exists (a bad flag, which every process meets) has no
    barrier to leave at: the launcher (torch elastic) stops every process as soon as one exits,
    so another process that got there first would cut the main process off before its one line
    (seen under load). This one waits instead; the launcher's SIGTERM ends the wait once the
    main process has left (its default action restored, whatever handler the run installed).
    Alone, it does not wait.
    """
    if not teardown.one_of_several_processes():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(seconds)
