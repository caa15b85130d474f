"""Errors that every process agrees on, so that one process's bad input stops all of them at once.

A `CliError` raised on one process only (the main process, reading the data first inside
`main_process_first`; or one rank, loading its own RNG file from a damaged checkpoint) would
leave the others waiting in their next collective: over gloo they die with a long "Connection
closed by peer" traceback, over NCCL they wait for the collective's timeout. Here the work runs,
every process's outcome is exchanged in one collective, and the first error is raised on every
process, marked as raised by all, so each exits with its code and the process group is closed
cleanly (`errors.run_cli`). With one process these are plain calls.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from accelerate.utils import gather_object

from t5_training.errors import CliError

T = TypeVar("T")


def _attempt(work: Callable[[], T]) -> tuple[T | None, CliError | None]:
    try:
        return work(), None
    except CliError as err:
        return None, err


def _raise_agreed(accelerator, error: CliError | None) -> None:
    """Raises the first process's error (in rank order) on every process, if any process had one."""
    errors = gather_object([error]) if accelerator.num_processes > 1 else [error]
    first = next((err for err in errors if err is not None), None)
    if first is not None:
        first.raised_by_every_process = True
        raise first


def on_every_process(accelerator, work: Callable[[], T]) -> T:
    """Runs `work` on every process; a CliError on any of them is raised on all."""
    if accelerator.num_processes == 1:
        return work()
    result, error = _attempt(work)
    _raise_agreed(accelerator, error)
    return result


def main_process_first(accelerator, work: Callable[[], T]) -> T:
    """`work` on the main process, then on the others (e.g. to fill a cache once), agreeing on errors.

    Like accelerate's `main_process_first`, except that an error on the main process stops the
    others before they start, and an error on any other process stops all.
    """
    if accelerator.num_processes == 1:
        return work()
    result, error = _attempt(work) if accelerator.is_main_process else (None, None)
    _raise_agreed(accelerator, error)
    if not accelerator.is_main_process:
        result, error = _attempt(work)
    _raise_agreed(accelerator, error)
    return result
