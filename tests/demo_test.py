"""README's first command, shortened: tokenizer, pretraining, two fine-tunings, one table and PNG."""
import os
import tempfile

from absl.testing import absltest

import demo


class DemoTest(absltest.TestCase):
    def test_short_demo_writes_table_inputs_and_loss_curves(self):
        with tempfile.TemporaryDirectory() as out:
            result = demo.main(["--output_dir", out, "--pretrain_steps", "4", "--fine_tune_steps", "4",
                                "--vocab_size", "1000"])
            # 448 validation articles; sports (103) is the most frequent topic.
            self.assertAlmostEqual(result["majority"], 100 * 103 / 448)
            self.assertEqual(result["pretrain"]["train"]["train_steps"], 4)
            self.assertEqual(result["fine_tuned"]["train"]["train_steps"], 4)
            self.assertEqual(result["scratch"]["train"]["train_steps"], 4)
            # The two fine-tunings start from different weights, so they do not train alike.
            self.assertNotEqual(result["fine_tuned"]["train"]["train_loss"], result["scratch"]["train"]["train_loss"])
            self.assertTrue(os.path.isfile(os.path.join(out, "loss_curves.png")))
            self.assertTrue(os.path.isfile(os.path.join(out, "pretrain", "final", "model.safetensors")))
            with open(os.path.join(out, "corpus", "validation.txt"), encoding="utf-8") as f:
                self.assertLen(f.readlines(), 448)


if __name__ == "__main__":
    absltest.main()
