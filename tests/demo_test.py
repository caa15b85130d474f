"""README's first command, shortened: the demo trains a tokenizer, fine-tunes, and reports."""
import os
import tempfile

from absl.testing import absltest

import demo


class DemoTest(absltest.TestCase):
    def test_short_demo_writes_table_inputs_and_loss_curve(self):
        with tempfile.TemporaryDirectory() as out:
            result = demo.main(["--output_dir", out, "--max_steps", "6", "--vocab_size", "1000"])
            # 448 validation articles; sports (103) is the most frequent topic.
            self.assertAlmostEqual(result["majority"], 100 * 103 / 448)
            self.assertEqual(result["train"]["train_steps"], 6)
            self.assertBetween(result["eval"]["accuracy"], 0.0, 100.0)
            self.assertTrue(os.path.isfile(os.path.join(out, "tokenizer", "tokenizer.json")))
            self.assertTrue(os.path.isfile(os.path.join(out, "fine_tune", "loss_curve.png")))
            self.assertTrue(os.path.isfile(os.path.join(out, "fine_tune", "final", "model.safetensors")))


if __name__ == "__main__":
    absltest.main()
