"""Pretraining's evaluation by teacher forcing: held-out loss, overall and per denoiser."""
import torch
from absl.testing import absltest
from accelerate import Accelerator
from transformers import AutoConfig, T5ForConditionalGeneration

from t5_training import batching, teacher_forced
from tests import fixtures


class TeacherForcedByGroupTest(absltest.TestCase):
    """A mixture's held-out loss per denoiser: the token-weighted loss over that denoiser's rows."""

    def test_loss_per_group_is_its_rows_token_mean(self):
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(AutoConfig.from_pretrained(fixtures.TINY_CONFIG, vocab_size=64)).eval()
        labels = torch.randint(2, 64, (6, 5))
        labels[[1, 4], 3:] = -100  # rows with fewer target tokens weigh less
        batch = {"input_ids": torch.randint(2, 64, (6, 7)), "attention_mask": torch.ones(6, 7, dtype=torch.long),
                 "labels": labels, "decoder_input_ids": batching.shift_right(labels, 0, 0),
                 "denoiser_ids": torch.tensor([0, 0, 2, 0, 2, 2])}
        loader = [{k: v[:3] for k, v in batch.items()}, {k: v[3:] for k, v in batch.items()}]
        with torch.no_grad():
            loss, tokens, _ = teacher_forced.row_stats(model, batch)
            results = teacher_forced.make_evaluator(Accelerator(cpu=True), loader, ["a", "b", "c"])(model)
        for name, rows in (("a", [0, 1, 3]), ("c", [2, 4, 5])):
            self.assertAlmostEqual(results[f"{name}/loss"], float(loss[rows].sum() / tokens[rows].sum()), places=5)
        self.assertNotIn("b/loss", results)  # no held-out row drew it
        self.assertAlmostEqual(results["loss"], float(loss.sum() / tokens.sum()), places=5)
        plain = teacher_forced.make_evaluator(Accelerator(cpu=True), loader)(model)
        self.assertEqual(plain, {"loss": results["loss"], "accuracy": results["accuracy"]})


if __name__ == "__main__":
    absltest.main()
