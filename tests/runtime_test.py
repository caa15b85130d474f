"""Tests for t5_training.runtime: preparing a run, and its length."""
import torch
import transformers
from absl.testing import absltest
from absl.testing import parameterized

from t5_training import runtime
from t5_training.config import TrainingConfig


class TotalStepsTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("max_steps_wins", dict(max_steps=5, num_train_epochs=10), 13, 5),
        ("epochs", dict(num_train_epochs=2), 13, 26),
        ("epochs_with_accumulation", dict(num_train_epochs=2, gradient_accumulation_steps=4), 13, 7),
        ("fractional_epoch", dict(num_train_epochs=0.5), 13, 7),
    )
    def test_total_train_steps(self, kwargs, batches_per_epoch, expected):
        self.assertEqual(runtime.total_train_steps(TrainingConfig(**kwargs), batches_per_epoch), expected)



class PrepareTest(absltest.TestCase):
    def test_the_config_accumulation_reaches_accelerate_and_the_run_has_its_length(self):
        from accelerate import Accelerator
        # Built with 2, as before --auto_find_batch_size raised the config's accumulation to 6.
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        config = TrainingConfig(output_dir="unused", gradient_accumulation_steps=6, num_train_epochs=2)
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2))
        train = torch.utils.data.DataLoader(list(range(30)), batch_size=2)  # 15 micro-batches
        evals = {"validation": torch.utils.data.DataLoader(list(range(4)), batch_size=2)}
        run = runtime.prepare(accelerator, config, model, train, evals)
        self.assertEqual(accelerator.gradient_accumulation_steps, 6)
        self.assertEqual((run.batches_per_epoch, run.total_steps), (15, 5))  # ceil(2 x 15 / 6)
        self.assertEqual(list(run.eval_loaders), ["validation"])
        self.assertIsNot(run.train_loader, train)  # sharded by accelerate
        unsharded = runtime.prepare(accelerator, config, model, train, evals, shard_train_loader=False)
        self.assertIs(unsharded.train_loader, train)


if __name__ == "__main__":
    absltest.main()
