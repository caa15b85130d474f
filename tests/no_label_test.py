"""Outputs that name no label (t5_training.no_label): which they are, their count and share, and the warnings."""
from absl.testing import absltest, parameterized

from t5_training import no_label
from t5_training.tasks import get_entry


class LabelOfTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # Label words match case and all, as in T5; an empty output names nothing.
        ("sst2", "glue", "sst2", ["positive", "negative", "neutral", "", "Positive"], [1, 0, None, None, None]),
        ("mnli", "glue", "mnli", ["contradiction", "maybe", "entailment"], [2, None, 0]),
        # A regression's output is an answer when float() reads a finite number from it.
        ("stsb", "glue", "stsb", ["3.4", "7", "abc", "nan", "inf", "", "1e-1"], [3.4, 7.0, None, None, None, None, 0.1]),
    )
    def test_label_of(self, benchmark, task, outputs, expected):
        entry = get_entry(benchmark, task)
        self.assertEqual([no_label.label_of(entry, text) for text in outputs], expected)


class CountsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("some", "sst2", ["positive", "negative", "neutral", "", "Positive"], 3),
        ("none", "cola", ["acceptable", "unacceptable"], 0),
        ("all", "mrpc", ["yes", "no", "maybe", "x"], 4),
        ("stsb_non_numbers", "stsb", ["3.4", "abc", "nan", "2", "five"], 3),
    )
    def test_count_and_share(self, task, outputs, expected):
        self.assertEqual(no_label.counts(get_entry("glue", task), outputs),
                         {"no_label": expected, "no_label_share": expected / len(outputs)})

    def test_free_text_answers_have_no_labels_to_miss(self):
        self.assertEqual(no_label.counts(get_entry("seq2seq", "summarization"), ["anything", ""]), {})

    def test_no_rows(self):
        self.assertEqual(no_label.counts(get_entry("glue", "sst2"), []), {"no_label": 0, "no_label_share": 0.0})


class WarningTest(parameterized.TestCase):

    def test_none_when_every_output_is_a_label(self):
        self.assertIsNone(no_label.warning("runs/x/submission/SST-2.tsv", 0, 1821, "1"))

    @parameterized.named_parameters(
        ("one", 1, 4, "25.0%", False),
        ("half_is_not_most", 2, 4, "50.0%", False),
        ("most", 3, 4, "75.0%", True),
        ("all", 1063, 1063, "100.0%", True),
    )
    def test_a_line_for_any_and_a_loud_one_when_most_fall_back(self, count, rows, percent, loud):
        path = "out/submission/CoLA.tsv"
        line = no_label.warning(path, count, rows, "1")
        self.assertStartsWith(line, f"WARNING: {path} is mostly the fallback, not the model's answers: " if loud
                              else f"warning: {path}: ")
        self.assertIn(f"{count} of {rows} test predictions ({percent}) name no label and were written as 1", line)
        self.assertEqual("the model has not learned the label words" in line, loud)
        self.assertNotIn("\n", line)

    def test_zip_summary_names_the_files_that_are_mostly_fallback(self):
        files = {"CoLA.tsv": {"rows": 10, "no_label": 10, "no_label_share": 1.0},
                 "SST-2.tsv": {"rows": 10, "no_label": 2, "no_label_share": 0.2},
                 "STS-B.tsv": {"rows": 10, "no_label": 6, "no_label_share": 0.6}}
        line = no_label.zip_warning("out/submission.zip", files)
        self.assertStartsWith(line, "WARNING: out/submission.zip holds files that are mostly the fallback, not the "
                                    "model's answers: CoLA.tsv (100.0% no label), STS-B.tsv (60.0% no label);")
        self.assertNotIn("SST-2", line)
        self.assertIsNone(no_label.zip_warning("out/submission.zip", {"SST-2.tsv": files["SST-2.tsv"]}))

    def test_dev_evaluation_gets_a_line_per_split_with_misses_and_a_loud_one_when_most(self):
        # A mixture's keys: <task>/<key>, and <task>/<split>/<key> for a task with several eval splits.
        results = {"score": 40.0, "cola/accuracy": 50.0, "cola/no_label": 0, "cola/no_label_share": 0.0,
                   "sst2/no_label": 3, "sst2/no_label_share": 3 / 32,
                   "mnli/validation_matched/no_label": 20, "mnli/validation_matched/no_label_share": 20 / 32}
        lines = no_label.dev_warnings(results)
        self.assertEqual(lines[0], "warning: eval_results.json: 3 of 32 dev outputs of sst2 (9.4%) name no label and "
                                   "are scored as wrong; predictions_*.tsv has the raw outputs")
        self.assertStartsWith(lines[1], "WARNING: eval_results.json: 20 of 32 dev outputs of mnli/validation_matched "
                                        "(62.5%) name no label and are scored as wrong: the model has not learned the "
                                        "label words")
        self.assertLen(lines, 2)
        self.assertEqual(no_label.dev_warnings({"no_label": 0, "no_label_share": 0.0, "accuracy": 100.0}), [])
        self.assertEqual(no_label.dev_warnings({"rougeLsum": 30.0}), [])  # a seq2seq task has no labels to miss


if __name__ == "__main__":
    absltest.main()
