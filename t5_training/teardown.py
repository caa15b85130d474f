"""The end of a multi-process run: its process group destroyed where no thread can deadlock on it.

DDP's C++ reducer holds a reference to the process group. Where it holds the last one, freeing the
model (as a script's main() returns) destroys the group from the reducer's destructor, which runs
with Python's GIL held, and gloo's destructor joins its worker threads. A worker that is just then
freeing a finished collective's tensors needs the GIL to release their Python objects: both wait
forever. Seen at the end of two-process runs on a loaded 2-core machine (torch 2.11, 2026-11-27:
py-spy showed the main thread in ProcessGroupGloo's destructor under Reducer's, the worker thread
waiting for the GIL in a finished all-gather's destructor). Not seen with torch 2.13 here, which
was not shown to be free of it.

A Python reference kept from just before the group is destroyed (`keep_process_group`) outlives
the model; dropped last (`release_process_group`, at the end of errors.run_cli), it destroys the
group through torch's Python holder for process groups, which releases the GIL first. The race
itself could not be made to happen on demand (it needs the worker thread to lose the GIL for the
few microseconds after a collective completes): tests/teardown_test.py checks that the scripts'
ends keep the group past the model and release it after main() returns.
"""
from __future__ import annotations

import sys

_kept: list = []


def distributed():
    """torch.distributed where this process is in a process group, else None (never imported here to find out)."""
    module = sys.modules.get("torch.distributed")
    return module if module is not None and module.is_available() and module.is_initialized() else None


def keep_process_group() -> None:
    """Keeps the default process group alive until `release_process_group`; call it before
    destroying the group. Nothing to keep (a single process, or no torch.distributed) is fine."""
    if distributed() is not None:
        _kept.append(distributed().group.WORLD)


def release_process_group() -> None:
    """Drops the kept group, the model that also held it being gone: its threads end here."""
    _kept.clear()


def kept_groups() -> tuple:
    """The process groups kept until `release_process_group`."""
    return tuple(_kept)
