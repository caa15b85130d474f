"""data_collator_t5.py: the name users import the pretraining collators by, the package's own objects."""
import ast
import os

from absl.testing import absltest
from transformers import AutoTokenizer

import data_collator_t5
from t5_training import collators, denoisers
from tests import fixtures


class PublicNamesTest(absltest.TestCase):
    def test_it_names_the_packages_collators(self):
        self.assertIs(data_collator_t5.DataCollatorForT5MLM, collators.DataCollatorForT5MLM)
        self.assertIs(data_collator_t5.DataCollatorForPrefixLM, collators.DataCollatorForPrefixLM)
        self.assertIs(data_collator_t5.DataCollatorForDenoiserMixture, denoisers.DataCollatorForDenoiserMixture)
        self.assertIs(data_collator_t5.compute_input_and_target_lengths, collators.compute_input_and_target_lengths)
        self.assertEqual(sorted(data_collator_t5.__all__), sorted(
            ["DataCollatorForT5MLM", "DataCollatorForPrefixLM", "DataCollatorForDenoiserMixture",
             "compute_input_and_target_lengths"]))

    def test_its_docstring_example_collates(self):
        # The usage its docstring shows, on the fixture tokenizer: a batch of T5's shapes.
        tokenizer = AutoTokenizer.from_pretrained(fixtures.tokenizer_dir())
        collator = data_collator_t5.DataCollatorForT5MLM(tokenizer, input_length=32, noise_density=0.15,
                                                         mean_noise_span_length=3.0)
        batch = collator([{"input_ids": [5] * collator.raw_length} for _ in range(2)])
        self.assertEqual(tuple(batch["input_ids"].shape), (2, 32))
        self.assertEqual(batch["labels"].shape[0], 2)

    def test_it_defines_nothing_of_its_own(self):
        with open(os.path.join(fixtures.REPO, "data_collator_t5.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        self.assertEqual([n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))], [])


if __name__ == "__main__":
    absltest.main()
