"""--auto_find_batch_size (t5_training/batch_size.py): the largest batch that fits, same global batch.

Too-large batches fail for real: the CPU allocator refuses them, nothing is mocked.
"""
import contextlib
import resource
import tempfile
import unittest

import torch
from absl.testing import absltest

import fine_tune_t5
from t5_training import batch_size, run_dir
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError
from tests import fixtures
from tests.simulated_gpu import gpu_host


def _tiny_model():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    # Narrower than t5-tiny: a too-large batch is refused at T5's first length x length tensor,
    # after the embeddings, whose batch x 2**19 x d_model floats cost memory traffic, not coverage.
    return T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2,
                                               decoder_start_token_id=0))


def _rows(n, source, target):
    ids = torch.full((n, source), 5)
    labels = torch.full((n, target), 6)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
            "decoder_input_ids": torch.full((n, target), 0)}


@contextlib.contextmanager
def address_space_capped(headroom: int = 4 << 30):
    """This process may map `headroom` bytes more than it has mapped now, and no more (RLIMIT_AS),
    so that the allocator refuses a larger tensor at once, whatever the kernel's overcommit policy.

    Without the cap, the refusal depended on the host: a kernel that overcommits (vm.overcommit_memory
    1, as on a lent GPU machine) granted a 2 TiB tensor, and the test process died filling it.
    """
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except OSError:
        raise unittest.SkipTest("needs Linux's /proc/self/status to cap the address space") from None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = mapped + headroom if hard == resource.RLIM_INFINITY else min(mapped + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


class FindBatchSizeTest(absltest.TestCase):
    # Beyond `fits` rows the batch is 2**17 tokens long: its first length x length tensor (the
    # relative positions, 128 GiB) is far beyond the 4 GiB that address_space_capped leaves the
    # probe, so the allocator refuses it at once (no mock), as it refuses a too-large batch.

    def _make_batch(self, fits):
        return lambda n: _rows(n, 16, 4) if n <= fits else _rows(n, 2 ** 17, 4)

    def _find(self, accelerator, config, model, fits):
        with address_space_capped():
            return batch_size.find_batch_size(accelerator, config, model, self._make_batch(fits))

    def test_steps_down_through_divisors_keeping_the_global_batch(self):
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        config = TrainingConfig(per_device_train_batch_size=12, gradient_accumulation_steps=2,
                                auto_find_batch_size=True)
        model = _tiny_model()
        before = torch.get_rng_state()
        found = self._find(accelerator, config, model, fits=5)
        # 12 -> 6 -> 4: the largest divisor of 12 that fits 5.
        self.assertEqual((found.per_device_train_batch_size, found.gradient_accumulation_steps), (4, 6))
        # The config is the one source of the accumulation: runtime.prepare passes it to accelerate.
        self.assertEqual(accelerator.gradient_accumulation_steps, 2)
        self.assertEqual(config.per_device_train_batch_size, 12)  # a new config; the old one is untouched
        self.assertTrue(torch.equal(torch.get_rng_state(), before), "the probe drew from the global RNG")
        self.assertTrue(all(p.grad is None for p in model.parameters()))

    def test_a_cpu_process_on_a_gpu_host_touches_no_gpu(self):
        # The probe's RNG is forked on the device the run uses, not on whatever the host has: here
        # torch claims a GPU that does not exist, so touching it would raise.
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        config = TrainingConfig(per_device_train_batch_size=4, auto_find_batch_size=True)
        with gpu_host(ACCELERATE_USE_CPU="1"):
            found = self._find(accelerator, config, _tiny_model(), fits=2)
        self.assertEqual(found.per_device_train_batch_size, 2)

    def test_help_says_it_steps_through_divisors(self):
        import dataclasses

        # 12 -> 6 -> 4 above: not halving, which from 12 would try 6 and then 3.
        (field,) = [f for f in dataclasses.fields(TrainingConfig) if f.name == "auto_find_batch_size"]
        self.assertIn("divisors of --per_device_train_batch_size (12: 6, 4, 3, 2, 1)", field.metadata["help"])
        self.assertNotIn("Halve", field.metadata["help"])

    def test_off_or_fitting_returns_the_same_config(self):
        from accelerate import Accelerator
        accelerator = Accelerator(cpu=True)
        for config in (TrainingConfig(per_device_train_batch_size=64),
                       TrainingConfig(per_device_train_batch_size=4, auto_find_batch_size=True)):
            found = self._find(accelerator, config, _tiny_model(), fits=4)
            self.assertIs(found, config)

    def test_nothing_fits_is_one_line(self):
        from accelerate import Accelerator
        config = TrainingConfig(per_device_train_batch_size=4, auto_find_batch_size=True)
        with self.assertRaisesRegex(UsageError, "even a batch of 1.*--gradient_checkpointing"):
            self._find(Accelerator(cpu=True), config, _tiny_model(), fits=0)

    def test_run_with_the_flag_equals_run_without_when_the_batch_fits(self):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            fine_tune_t5.main(fixtures.fine_tune_args(a, "--max_steps", "3", "--save_steps", "3"))
            fine_tune_t5.main(fixtures.fine_tune_args(b, "--max_steps", "3", "--save_steps", "3",
                                                      "--auto_find_batch_size"))
            self.assertEqual(run_dir.read_losses(a), run_dir.read_losses(b))


if __name__ == "__main__":
    absltest.main()
