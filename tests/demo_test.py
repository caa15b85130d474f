"""README's first command, shortened: tokenizer, pretraining, paired fine-tunings, one table and PNG."""
import json
import os

from absl.testing import absltest

import demo
from t5_training.collators import compute_input_and_target_lengths
from t5_training.errors import UsageError
from tests import fixtures


class DemoTest(fixtures.TempDirTestCase):

    def test_short_demo_writes_table_inputs_and_loss_curves(self):
        out = os.path.join(self.dir, "demo")
        result = demo.main(["--output_dir", out, "--pretrain_steps", "4", "--fine_tune_steps", "4",
                            "--vocab_size", "1000", "--labelled", "20", "--seeds", "3", "5", "--source_length", "32"])
        # 448 validation articles; sports (103) is the most frequent topic.
        self.assertAlmostEqual(result["majority"], 100 * 103 / 448)
        self.assertEqual(result["pretrain"]["train"]["train_steps"], 4)
        # Tokens seen: 32 chunks a step of 128 corrupted input tokens and 29 target tokens (T5's
        # lengths for 15% noise in spans of mean 3), none of them padding.
        self.assertEqual(compute_input_and_target_lengths(128, 0.15, 3.0)[1], 29)
        self.assertEqual(result["pretrain"]["train"]["train_tokens"], 4 * 32 * (128 + 29))
        self.assertEqual(sorted(result["runs"]), [3, 5])
        for seed in (3, 5):
            pair = result["runs"][seed]
            self.assertEqual([pair[init]["train"]["train_steps"] for init in demo.INITS], [4, 4])
            # Each article is read up to --source_length tokens (all are longer), plus a label word and EOS.
            for init in demo.INITS:
                train = pair[init]["train"]
                self.assertBetween(train["train_tokens"], train["train_samples"] * (32 + 2),
                                   train["train_samples"] * (32 + 8))
            # The two fine-tunings start from different weights, so they do not train alike.
            self.assertNotEqual(pair["pretrained"]["train"]["train_loss"], pair["random init"]["train"]["train_loss"])
        # Each seed draws its own 20 labelled articles; every run is scored on all 448 held-out ones.
        labelled = {}
        for seed in (3, 5):
            with open(os.path.join(out, "labelled", f"seed{seed}.jsonl"), encoding="utf-8") as f:
                labelled[seed] = [json.loads(line)["text"] for line in f]
            self.assertLen(labelled[seed], 20)
        self.assertNotEqual(labelled[3], labelled[5])
        with open(os.path.join(out, "corpus", "validation.jsonl"), encoding="utf-8") as f:
            self.assertLen(f.readlines(), 448)
        with open(os.path.join(out, "corpus", "validation.txt"), encoding="utf-8") as f:
            self.assertLen(f.readlines(), 448)
        # The table: both inits per seed, the paired difference, computed from the runs' own results.
        table = {row["model"]: row for row in result["summary"]["table"]}
        for seed in (3, 5):
            accuracy = {init: result["runs"][seed][init]["eval"]["accuracy"] for init in demo.INITS}
            self.assertAlmostEqual(table["pretrained - random init"][f"seed {seed}"],
                                   accuracy["pretrained"] - accuracy["random init"], places=1)
        self.assertEqual(result["summary"]["difference"]["pairs"], 2)
        self.assertTrue(os.path.isfile(result["png"]))
        self.assertTrue(os.path.isfile(os.path.join(out, "pretrain", "final", "model.safetensors")))

    def test_more_labels_than_articles_is_one_clear_error(self):
        with self.assertRaisesRegex(UsageError, "--labelled 5000 is more than the 1777 training articles"):
            demo.main(["--output_dir", os.path.join(self.dir, "demo"), "--pretrain_steps", "1",
                       "--fine_tune_steps", "1", "--vocab_size", "1000", "--labelled", "5000"])


if __name__ == "__main__":
    absltest.main()
