"""Tests for t5_training.teardown: a run's process group outlives its model, and ends after main().

`EndsOfDdpModelsTest` makes the deadlock that teardown prevents happen on demand: two processes end
DDP models one after another, each on a fresh gloo group destroyed while the model still holds it,
right after a barrier that keeps an unfinished all-gather. Without keeping the group it hangs
within its first iterations under torch 2.11 and 2.13 (docs/results/testing.md#the-end-of-a-multi-process-run);
kept and released as the scripts do, it ends.
The other tests check that the scripts' ends keep the group and release it after main() returns.
"""
import os
import subprocess
import sys
import tempfile
from unittest import mock

import torch.distributed as dist
from absl.testing import absltest
from accelerate import Accelerator

from t5_training import errors, runtime, teardown
from tests import fixtures, processes


def _written(folder: str, source: str) -> str:
    """`source` written as script.py in `folder`; its path."""
    path = os.path.join(folder, "script.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return path


def _both_end(test, source: str, args: list[str]):
    """Runs `source` (its first argument: the checkout) as two processes, which must both print
    "ended" and exit 0 within 120 s; returns how they ended."""
    with tempfile.TemporaryDirectory() as folder:
        done = processes.launch_two(_written(folder, source), [fixtures.REPO, *args], timeout=120)
    test.assertEqual(done.returncode, 0, done.stderr[-3000:])
    test.assertEqual(done.stdout.count("ended"), 2, done.stdout)
    return done


class _OneProcessGroup(absltest.TestCase):
    """A real one-process gloo group in the test process, destroyed after each test."""

    def setUp(self):
        super().setUp()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.addCleanup(teardown.release_process_group)
        self.addCleanup(lambda: dist.is_initialized() and dist.destroy_process_group())


class KeepTest(_OneProcessGroup):
    def test_the_group_is_kept_past_its_destruction_until_released(self):
        group = dist.group.WORLD
        teardown.keep_process_group()
        dist.destroy_process_group()
        self.assertFalse(dist.is_initialized())
        self.assertEqual(teardown.kept_groups(), (group,))
        teardown.release_process_group()
        self.assertEqual(teardown.kept_groups(), ())

    def test_a_runs_end_keeps_the_group(self):
        accelerator = Accelerator(cpu=True)
        runtime.close(accelerator)  # what both training scripts call last
        self.assertFalse(dist.is_initialized())  # end_training destroyed it
        self.assertLen(teardown.kept_groups(), 1)

    def test_an_error_every_process_raised_keeps_the_group_too(self):
        def main(argv):
            raise errors.WriteError("a full disk, met by every process")

        with mock.patch.object(teardown, "release_process_group") as release:
            self.assertEqual(errors.run_cli(main, []), errors.EXIT_USAGE)
        release.assert_called_once()
        self.assertFalse(dist.is_initialized())
        self.assertLen(teardown.kept_groups(), 1)


class ReleaseTest(absltest.TestCase):
    def test_run_cli_releases_the_group_after_main_returns(self):
        seen = []

        def main(argv):
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            teardown.keep_process_group()
            dist.destroy_process_group()
            seen.extend(teardown.kept_groups())

        self.assertEqual(errors.run_cli(main, []), 0)
        self.assertLen(seen, 1)
        self.assertEqual(teardown.kept_groups(), ())

    def test_without_a_process_group_nothing_is_kept(self):
        teardown.keep_process_group()
        self.assertEqual(teardown.kept_groups(), ())


# Each iteration ends a DDP model as a script's end does (barrier, destroy the group, the model
# freed), with the worst timing: the barrier keeps an all-gather whose tensors only the gloo worker
# still holds, and the model is freed at once, the GIL held throughout.
_ENDS = """\
import sys
sys.path.insert(0, sys.argv[1])
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from t5_training import errors, teardown

def main(argv):
    dist.init_process_group("gloo")
    for i in range(int(argv[0])):
        group = dist.new_group(backend="gloo")
        model = DistributedDataParallel(torch.nn.Linear(2, 2), process_group=group)
        model(torch.ones(1, 2)).sum().backward()
        outputs = [torch.empty(1) for _ in range(2)]
        dist.all_gather(outputs, torch.ones(1), group=group, async_op=True)
        del outputs
        dist.barrier(group=group)
        teardown.keep_process_group(group)
        dist.destroy_process_group(group)
        del group, model
        teardown.release_process_group()
    teardown.keep_process_group()
    dist.destroy_process_group()
    print("ended", flush=True)

sys.exit(errors.run_cli(main, sys.argv[2:]))
"""


# The end of both exit tests' scripts: an all-gather whose outputs only the gloo worker still
# holds, then the group kept and destroyed.
_PREAMBLE = """\
import sys
sys.path.insert(0, sys.argv[1])
import torch
import torch.distributed as dist
from t5_training import teardown

dist.init_process_group("gloo")
"""
_A_WORKER_STILL_HOLDS = """\
outputs = [torch.empty(1000) for _ in range(2)]
dist.all_gather(outputs, torch.ones(1000), async_op=True)
del outputs
teardown.keep_process_group()
dist.destroy_process_group()
print("ended", flush=True)
"""

# main() called other than through run_cli (a user's own script, a test): nothing releases the kept
# group before the interpreter shuts down.
_KEPT_AT_EXIT = _PREAMBLE + _A_WORKER_STILL_HOLDS

# A group torch itself holds past the release (a module imported after the group was made takes it
# as a default argument): freed during the interpreter's shutdown, it aborted 7 of 8 such pairs
# ending through sys.exit (torch 2.13); the scripts end through exit_process.
_HELD_BY_TORCH = (_PREAMBLE + "import torch.distributed.nn.functional\n" + _A_WORKER_STILL_HOLDS
                  + "teardown.exit_process(0)\n")

# exit_process in one process of a launch (WORLD_SIZE=2) or alone: the atexit handlers run and
# buffered output is written either way.
_EXITS_WITH = """\
import atexit, sys
sys.path.insert(0, sys.argv[1])
from t5_training import teardown
atexit.register(print, "handler ran")
sys.stdout.write("unflushed ")
teardown.exit_process(3)
"""


class ExitTest(absltest.TestCase):
    def test_a_group_kept_outside_run_cli_is_released_before_the_interpreter_shuts_down(self):
        # Released during the shutdown instead, the group's destructor lets its worker ask for the
        # GIL, and the interpreter ends that thread inside a destructor: both processes abort with
        # "terminate called without an active exception" (every run, torch 2.13).
        done = _both_end(self, _KEPT_AT_EXIT, [])
        self.assertNotIn("terminate called", done.stderr)

    def test_a_group_torch_still_holds_ends_the_process_without_aborting(self):
        done = _both_end(self, _HELD_BY_TORCH, [])
        self.assertNotIn("terminate called", done.stderr)

    def test_exit_process_runs_the_atexit_handlers_flushes_and_exits_with_the_code(self):
        with tempfile.TemporaryDirectory() as folder:
            path = _written(folder, _EXITS_WITH)
            for world_size in ("2", "1"):
                with self.subTest(world_size=world_size):
                    done = subprocess.run([sys.executable, path, fixtures.REPO], capture_output=True, text=True,
                                          env={**os.environ, "WORLD_SIZE": world_size}, timeout=120)
                    self.assertEqual((done.returncode, done.stdout), (3, "unflushed handler ran\n"), done.stderr)

    def test_each_keep_makes_the_release_the_last_atexit_handler_registered(self):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        self.addCleanup(teardown.release_process_group)
        with mock.patch.object(teardown.atexit, "register") as register, \
                mock.patch.object(teardown.atexit, "unregister") as unregister:
            teardown.keep_process_group()
            teardown.keep_process_group()
            dist.destroy_process_group()
        self.assertEqual(register.call_args_list, [mock.call(teardown.release_process_group)] * 2)
        self.assertEqual(unregister.call_args_list, [mock.call(teardown.release_process_group)] * 2)


class EndsOfDdpModelsTest(absltest.TestCase):
    def test_two_processes_end_a_hundred_ddp_models_without_hanging(self):
        # About 5 s of iterations on 2 cores; a hang is killed at the limit and fails the test.
        _both_end(self, _ENDS, ["100"])


if __name__ == "__main__":
    absltest.main()
