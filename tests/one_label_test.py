"""Classifiers stuck at one label (t5_training.one_label): the share, the verdict, the warnings, and a real run."""
import contextlib
import io
import json
import os
import tempfile

from absl.testing import absltest, parameterized

import fine_tune_t5
from t5_training import one_label
from t5_training.tasks import get_entry
from tests import fixtures, made_data

SST2 = get_entry("glue", "sst2")
HALF = ["positive", "negative"] * 10  # references: half and half


class CountsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("every_output_one_label", ["positive"] * 20, HALF, 1.0, 1),
        ("at_the_threshold", ["positive"] * 19 + ["negative"], HALF, 0.95, 1),
        ("just_below_it", ["positive"] * 18 + ["negative"] * 2, HALF, 0.9, 0),
        ("mixed", HALF, HALF, 0.5, 0),
        # Outputs that name no label count in the share's denominator, not as a label (no_label counts them).
        ("no_label_outputs", ["positive"] * 18 + ["maybe", ""], HALF, 0.9, 0),
        ("only_no_label_outputs", ["maybe"] * 20, HALF, 0.0, 0),
        # A task whose references are nearly all one class: predicting it everywhere is not being stuck.
        ("the_references_are_one_class_too", ["positive"] * 20, ["positive"] * 19 + ["negative"], 1.0, 0),
        ("one_class_a_margin_above_them", ["positive"] * 20, ["positive"] * 17 + ["negative"] * 3, 1.0, 1),
    )
    def test_share_and_verdict(self, outputs, targets, share, stuck):
        self.assertEqual(one_label.counts(SST2, outputs, targets), {"top_label_share": share, "one_label": stuck})

    @parameterized.named_parameters(("regression", "glue", "stsb"), ("free_text", "seq2seq", "summarization"))
    def test_only_classification_has_a_top_label(self, benchmark, task):
        self.assertEqual(one_label.counts(get_entry(benchmark, task), ["3.0"] * 4, ["1.0", "2.0", "3.0", "4.0"]), {})

    def test_no_rows(self):
        self.assertEqual(one_label.counts(SST2, [], []), {})


def _evaluations(*verdicts, prefix=""):
    """An evaluate(model) that returns one result per call, stuck or not as `verdicts` say."""
    results = iter([{f"{prefix}accuracy": 50.0, f"{prefix}top_label_share": 1.0 if stuck else 0.6,
                     f"{prefix}one_label": int(stuck)} for stuck in verdicts])
    return lambda model: next(results)


class WatchTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("three_in_a_row", [1, 1, 1], [2]),
        ("warned_once_however_long_it_stays", [1, 1, 1, 1, 1, 1], [2]),
        ("a_learning_evaluation_resets_the_count", [1, 1, 0, 1, 1, 0, 1], []),
        ("again_after_it_left_and_came_back", [1, 1, 1, 0, 1, 1, 1], [2, 6]),
        ("never_stuck", [0, 0, 0, 0], []),
    )
    def test_warns_when_patience_evaluations_in_a_row_are_stuck(self, verdicts, warned_after):
        lines, calls = [], []  # a warning is tagged with the number of calls before it: its call's index
        watched = one_label.watch(_evaluations(*verdicts), lambda line: lines.append((len(calls), line)))
        for _ in verdicts:
            calls.append(watched(None))
        self.assertEqual([after for after, _ in lines], warned_after)
        # The results pass through unchanged.
        self.assertEqual([r["one_label"] for r in calls], verdicts)
        for _, line in lines:
            self.assertTrue(line.startswith("WARNING: 100.0% of the dev outputs have named one label in each of the "
                                            "last 3 evaluations: the model answers with one label"), line)

    def test_a_mixture_names_the_task(self):
        lines = []
        watched = one_label.watch(_evaluations(1, 1, prefix="cola/"), lines.append, patience=2)
        watched(None), watched(None)
        self.assertLen(lines, 1)
        self.assertStartsWith(lines[0], "WARNING: cola: 100.0% of the dev outputs")


class DevWarningsTest(absltest.TestCase):

    def test_a_line_per_stuck_task_and_none_for_the_others(self):
        results = {"sst2/accuracy": 50.9, "sst2/top_label_share": 1.0, "sst2/one_label": 1,
                   "cola/accuracy": 70.0, "cola/top_label_share": 0.8, "cola/one_label": 0}
        lines = one_label.dev_warnings(results)
        self.assertLen(lines, 1)
        self.assertStartsWith(lines[0], "WARNING: eval_results.json: sst2: 100.0% of the dev outputs name one label: ")
        self.assertIn("docs/peft.md#stuck-at-one-label", lines[0])
        self.assertEqual(one_label.dev_warnings({"accuracy": 66.0, "top_label_share": 0.6, "one_label": 0}), [])


class StuckRunTest(absltest.TestCase):
    """A real run that can only learn one label: its training rows are all positive."""

    def test_the_run_records_it_and_warns_while_training_and_at_the_end(self):
        with tempfile.TemporaryDirectory() as out:
            rows, dev = os.path.join(out, "positive.jsonl"), os.path.join(out, "dev.jsonl")
            sentences = made_data.sentences(72)
            with open(rows, "w", encoding="utf-8") as f:
                for sentence in sentences[:48]:
                    f.write(json.dumps({"sentence": sentence, "label": 1}) + "\n")
            with open(dev, "w", encoding="utf-8") as f:  # half and half, as SST-2's dev rows are
                for i, sentence in enumerate(sentences[48:]):
                    f.write(json.dumps({"sentence": sentence, "label": i % 2}) + "\n")
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                results = fine_tune_t5.main(fixtures.fine_tune_args(
                    os.path.join(out, "run"), "--train_file", rows, "--validation_file", dev, "--max_steps", "30",
                    "--eval_steps", "10", "--learning_rate", "1e-2", "--eval_decoding", "score"))
            self.assertEqual((results["eval"]["top_label_share"], results["eval"]["one_label"]), (1.0, 1))
            with open(os.path.join(out, "run", "eval_results.json"), encoding="utf-8") as f:
                self.assertEqual(json.load(f)["one_label"], 1)
            warned = stderr.getvalue()
            self.assertEqual(warned.count("of the dev outputs have named one label in each of the last 3 "
                                          "evaluations"), 1, warned)
            self.assertEqual(warned.count("eval_results.json: 100.0% of the dev outputs name one label"), 1, warned)


if __name__ == "__main__":
    absltest.main()
