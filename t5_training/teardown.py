"""The end of a multi-process run: its process group destroyed where no thread can deadlock on it.

DDP's C++ reducer holds a reference to the process group. Where it holds the last one, freeing the
model (as a script's main() returns) destroys the group from the reducer's destructor, which runs
with Python's GIL held, and gloo's destructor joins its worker threads. A worker that is just then
freeing a finished collective (a barrier keeps the all-gather it waited for) must take the GIL to
release the Python objects of that collective's tensors: both threads wait forever. Two-process
runs on a loaded machine hung so at exit (torch 2.11), and tests/teardown_test.py's loop does under
torch 2.13 too (docs/reliability.md#the-end-of-a-multi-process-run).

So a run keeps a Python reference to the group from just before it is destroyed
(`keep_process_group`) until main() has returned and its model is gone (`release_process_group`,
at the end of errors.run_cli). The reducer then drops a reference that is not the last, and the
release destroys the group through torch's Python holder for process groups, which lets go of the
GIL first: a worker that needs the GIL gets it, finishes, and is joined.

The release must come before the interpreter's shutdown. A group destroyed during it (a kept one
freed with this module's globals, when main() was called other than through run_cli) aborts the
process with "terminate called without an active exception" if a worker still has to free such
tensors: the shutting-down interpreter ends a thread that asks for the GIL, from inside a C++
destructor that may not be unwound. So the first keep also registers the release with atexit,
whose handlers run while threads can still take the GIL.

Released is not always ended: torch may hold the group elsewhere. A module imported after the group
was made can take it as a default argument (torch.distributed.nn.functional does, and DDP's import
of torch._dynamo brings it in), and in the scripts' two-process runs something in C++ held it past
the release every time, so that it was never destroyed at all (its gloo threads were still running
at exit). A worker still freeing a finished collective's tensors when the shutdown began then aborted
the run as above: one CI run in several hundred, after every file was written. So a process of a
multi-process launch ends through `exit_process`, which runs the atexit handlers and then ends the
process before the interpreter's shutdown, where no thread can be stopped inside a destructor.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn

_kept: list = []


def initialized_distributed():
    """torch.distributed where this process is in a process group, else None (never imported here
    to find out: a single-process run need not pay for it)."""
    distributed = sys.modules.get("torch.distributed")
    return distributed if distributed is not None and distributed.is_available() and distributed.is_initialized() \
        else None


def keep_process_group(group=None) -> None:
    """Keeps `group` (default: the default group) alive until `release_process_group`; call it
    before destroying the group. Nothing to keep (a single process, no torch.distributed) is fine."""
    if group is None and (distributed := initialized_distributed()) is not None:
        group = distributed.group.WORLD
    if group is not None:
        _kept.append(group)
        # Registered once, and last: atexit runs the latest handlers first, before any that
        # torch's or a tracker's imports registered.
        atexit.unregister(release_process_group)
        atexit.register(release_process_group)


def release_process_group() -> None:
    """Drops the kept groups, whatever else held them (a model's reducer) being gone: their worker
    threads end here. Also an atexit handler (keep_process_group), for a main() not run by run_cli."""
    _kept.clear()


def kept_groups() -> tuple:
    """The process groups kept until `release_process_group`."""
    return tuple(_kept)


def one_of_several_processes() -> bool:
    """Whether this process is one of a multi-process launch's (accelerate, torchrun, DeepSpeed)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_process(code: int) -> NoReturn:
    """Ends a script's process with exit status `code`: through the interpreter's shutdown in a
    single process, else without it (see above), once the atexit handlers (trackers, logging,
    temporary folders, the release above) have run and the output streams are flushed."""
    if not one_of_several_processes():
        sys.exit(code)
    # What the shutdown would have run first. The function is private to atexit, but it is the one
    # way to run the handlers now rather than at a shutdown that never comes.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
