"""Tests for t5_training.teardown: a run's process group outlives its model, and ends after main().

The deadlock it prevents (DDP's reducer destroying the group with the GIL held while a gloo
worker waits for the GIL) is a race of a few microseconds that no test here could make happen on
demand; these tests check the order that rules it out, on a real gloo group.
"""
import os
import tempfile
from unittest import mock

import torch.distributed as dist
from absl.testing import absltest
from accelerate import Accelerator

from t5_training import errors, runtime, teardown
from tests import fixtures, processes


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
        runtime.close(accelerator)  # what both scripts call last
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


class TwoProcessEndTest(absltest.TestCase):
    def test_two_processes_end_with_exit_code_0(self):
        # The scripts' end over gloo, DDP's reducer included, with errors.run_cli releasing the group.
        script = ("import sys\nsys.path.insert(0, sys.argv[1])\nimport torch\nfrom accelerate import Accelerator\n"
                  "from t5_training import errors, runtime\n"
                  "def main(argv):\n"
                  "    accelerator = Accelerator(cpu=True)\n"
                  "    model = accelerator.prepare(torch.nn.Linear(2, 2))\n"
                  "    model(torch.ones(1, 2)).sum().backward()\n"
                  "    accelerator.gather(torch.ones(1))\n"
                  "    runtime.close(accelerator)\n"
                  "    print('ended', flush=True)\n"
                  "sys.exit(errors.run_cli(main, sys.argv[2:]))\n")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "end.py")
            with open(path, "w") as f:
                f.write(script)
            done = processes.launch_two(path, [fixtures.REPO], timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        self.assertEqual(done.stdout.count("ended"), 2, done.stdout)


if __name__ == "__main__":
    absltest.main()
