"""Evaluation with sharded weights (t5_training.sharding): FSDP 1 and 2 over two gloo processes on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from unittest import mock

import torch
from absl.testing import absltest, parameterized
from accelerate.utils import DistributedType

from t5_training import sharding
from tests import fixtures

WORKER = os.path.join(fixtures.REPO, "tests", "fsdp_worker.py")


class TwoProcessEvaluationTest(parameterized.TestCase):
    @parameterized.named_parameters(("fsdp1", "1"), ("fsdp2", "2"))
    def test_a_sharded_model_decodes_as_the_whole_one(self, version):
        # accelerate runs FSDP only on GPUs, torch runs both versions on CPUs over gloo: the
        # worker shards the model itself (tests/fsdp_worker.py says how). Without the root's
        # weights gathered, the encoder's embedding fails (FSDP2: "mixed torch.Tensor and
        # DTensor"; FSDP1: "'weight' must be 2-D"); without synced generation, the process that
        # generates longer waits on one that stopped.
        with tempfile.TemporaryDirectory() as out:
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                   "2", WORKER, version, out], cwd=fixtures.REPO, capture_output=True, text=True,
                                  timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            ranks = []
            for rank in (0, 1):
                with open(os.path.join(out, f"rank-{rank}.json"), encoding="utf-8") as f:
                    ranks.append(json.load(f))
        for rank, got in enumerate(ranks):
            sharded, whole = got["sharded"], got["whole"]
            self.assertEqual(sharded["predicted"], whole["predicted"], f"rank {rank}")
            self.assertEqual(sharded["generated_rows"], len(got["labels"]))
            for a, b in zip(sharded["loss"], whole["loss"]):
                self.assertAlmostEqual(a, b, delta=1e-5 * abs(b))
        # The two processes generated for different numbers of steps (8, the limit, and 5).
        widths = [{len(row) for row in got["sharded"]["predicted"]} for got in ranks]
        self.assertNotEqual(widths[0], widths[1])


class ShardsWeightsTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("zero3", DistributedType.DEEPSPEED, 3, True), ("zero2", DistributedType.DEEPSPEED, 2, False),
        ("fsdp", DistributedType.FSDP, None, True), ("ddp", DistributedType.MULTI_CPU, None, False),
        ("one_process", DistributedType.NO, None, False))
    def test_by_the_launch(self, distributed_type, zero_stage, expected):
        accelerator = mock.Mock(distributed_type=distributed_type)
        accelerator.state.deepspeed_plugin.zero_stage = zero_stage
        self.assertEqual(sharding.shards_weights(accelerator, torch.nn.Linear(2, 2)), expected)

    def test_an_unsharded_model_is_evaluated_as_it_is(self):
        model = fixtures.tiny_model()
        self.assertFalse(sharding.is_fsdp(model))
        before = {name: p.clone() for name, p in model.named_parameters()}
        with sharding.root_weights_gathered(model):
            pass
        for name, p in model.named_parameters():
            self.assertTrue(torch.equal(p, before[name]), name)


if __name__ == "__main__":
    absltest.main()
