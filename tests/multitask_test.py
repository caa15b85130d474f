"""A run over several tasks: the GLUE score, the tasks' folders, and fine_tune_t5.py on a real mixture.

The end-to-end cases train the tiny model on SST-2 and CoLA read from the GLUE-shaped folder the
tests make (made_data.py), as `--dataset_name sst2,cola --data_dir <GLUE download>` does.
"""
from __future__ import annotations

import csv
import json
import os
import zipfile
from types import SimpleNamespace

from absl.testing import absltest, parameterized

import fine_tune_t5
from t5_training.registry import GLUE
from t5_training import mixture, multitask, run_dir, submission
from t5_training.errors import UsageError
from tests import fixtures, made_data, processes

# Made-up dev scores of a GLUE run, each task's metrics and its loss (which no score counts).
NINE = {
    "cola/matthews_corrcoef": 40.0, "cola/loss": 9.0,
    "sst2/accuracy": 90.0, "sst2/loss": 9.0,
    "mrpc/f1": 80.0, "mrpc/accuracy": 70.0, "mrpc/loss": 9.0,
    "qqp/f1": 70.0, "qqp/accuracy": 80.0, "qqp/loss": 9.0,
    "stsb/pearson_corrcoef": 60.0, "stsb/spearman_corrcoef": 50.0, "stsb/loss": 9.0,
    "mnli/validation_matched/accuracy": 70.0, "mnli/validation_mismatched/accuracy": 66.0,
    "mnli/validation_matched/loss": 9.0, "mnli/validation_mismatched/loss": 9.0,
    "qnli/accuracy": 85.0, "qnli/loss": 9.0,
    "rte/accuracy": 60.0, "rte/loss": 9.0,
    "wnli/accuracy": 50.0, "wnli/loss": 9.0,
}


class ScoreTest(parameterized.TestCase):

    def test_task_scores_average_two_metrics_and_mnlis_two_splits(self):
        self.assertEqual(multitask.task_score(GLUE["mrpc"], {"f1": 80.0, "accuracy": 70.0, "loss": 1.0}), 75.0)
        self.assertEqual(multitask.task_score(GLUE["stsb"], {"pearson_corrcoef": 60.0, "spearman_corrcoef": 50.0}),
                         55.0)
        self.assertEqual(multitask.task_score(GLUE["mnli"], {"validation_matched/accuracy": 70.0,
                                                             "validation_mismatched/accuracy": 66.0}), 68.0)
        self.assertEqual(multitask.task_score(GLUE["cola"], {"matthews_corrcoef": 40.0, "loss": 3.0}), 40.0)

    def test_glue_score_of_all_nine_tasks(self):
        # CoLA 40, SST-2 90, MRPC 75, QQP 75, STS-B 55, MNLI 68, QNLI 85, RTE 60, WNLI 50: 598 / 9.
        self.assertAlmostEqual(multitask.benchmark_score(GLUE, NINE), 598 / 9)

    def test_score_of_a_subset_averages_its_tasks(self):
        chosen = {name: GLUE[name] for name in ("cola", "mrpc", "stsb")}
        self.assertAlmostEqual(multitask.benchmark_score(chosen, NINE), (40 + 75 + 55) / 3)

    def test_objective_is_the_score_for_a_mixture_and_the_tasks_own_alone(self):
        mixed = multitask.Tasks({name: GLUE[name] for name in ("cola", "sst2")}, {}, {})
        self.assertEqual(multitask.objective("glue", mixed).metric, "glue_score")
        alone = multitask.Tasks({"mnli": GLUE["mnli"]}, {}, {})
        self.assertEqual(multitask.objective("glue", alone).metric, "validation_matched/accuracy")


class TaskDirsTest(fixtures.TempDirTestCase):

    def test_each_task_in_its_folder(self):
        glue = fixtures.glue_dir()
        config = SimpleNamespace(data_dir=glue)
        dirs = multitask.task_dirs(config, {name: GLUE[name] for name in ("stsb", "cola")})
        self.assertEqual(dirs, {"stsb": os.path.join(glue, "STS-B"), "cola": os.path.join(glue, "CoLA")})
        # One task keeps --data_dir as its own folder.
        self.assertEqual(multitask.task_dirs(config, {"cola": GLUE["cola"]}), {"cola": glue})

    def test_missing_folders_are_named_in_one_line(self):
        os.makedirs(os.path.join(self.dir, "CoLA"))
        with self.assertRaisesRegex(UsageError, r"has no folder for rte \(RTE/\), mrpc \(MRPC/\); add the folders"):
            multitask.task_dirs(SimpleNamespace(data_dir=self.dir),
                                {name: GLUE[name] for name in ("cola", "rte", "mrpc")})


def _no_label(path: str, words) -> int:
    """How many outputs in a predictions file are none of the label words."""
    with open(path, encoding="utf-8") as f:
        return sum(row["prediction"] not in words for row in csv.DictReader(f, delimiter="\t"))


def mixture_args(out: str, *extra: str) -> list[str]:
    return fixtures.fine_tune_args(out, "--dataset_name", "sst2,cola", "--data_dir", fixtures.glue_dir(),
                                   "--max_eval_samples", "24", *extra)


class MixtureRunTest(fixtures.TempDirTestCase):

    def test_trains_evaluates_every_task_and_writes_its_files(self):
        out = os.path.join(self.dir, "run")
        # Length grouping, label scoring and the batch-size probe on a mixture, as the issue asks.
        result = fine_tune_t5.main(mixture_args(
            out, "--max_steps", "6", "--eval_steps", "3", "--mixing", "temperature", "--mixing_temperature", "2",
            "--group_by_length", "--eval_decoding", "score", "--auto_find_batch_size", "--do_predict",
            "--report_to", "tensorboard"))
        evals = result["eval"]
        self.assertContainsSubset({"sst2/accuracy", "sst2/loss", "cola/matthews_corrcoef", "cola/loss",
                                   "glue_score"}, evals)
        self.assertEqual(evals["metric_to_optimize"], "glue_score")
        self.assertAlmostEqual(evals["glue_score"], (evals["sst2/accuracy"] + evals["cola/matthews_corrcoef"]) / 2)
        scalars = fixtures.tensorboard_scalars(out)
        self.assertContainsSubset({"eval/sst2/accuracy", "eval/cola/matthews_corrcoef", "eval/glue_score",
                                   "train/loss"}, scalars)
        self.assertEqual([step for step, _ in scalars["eval/glue_score"]], [3, 6])

        for task, rows in (("sst2", 24), ("cola", 24)):
            with open(os.path.join(out, f"predictions_{task}_validation.tsv"), encoding="utf-8") as f:
                lines = list(csv.reader(f, delimiter="\t"))
            self.assertLen(lines, rows + 1)
            self.assertStartsWith(lines[1][0], f"{task} sentence: ")
        # Every test row of both tasks, and one zip holding both files.
        with open(os.path.join(out, "submission", "CoLA.tsv"), encoding="utf-8") as f:
            self.assertLen(f.readlines(), 1 + made_data.SIZES["test"])
        with open(os.path.join(out, "submission", "SST-2.tsv"), encoding="utf-8") as f:
            self.assertLen(f.readlines(), 1 + made_data.SIZES["test"])
        with zipfile.ZipFile(os.path.join(out, "submission.zip")) as archive:
            self.assertEqual(sorted(archive.namelist()), ["CoLA.tsv", "SST-2.tsv"])

        # Each task's outputs that are no label word, counted on its dev rows (eval results) and test rows.
        with open(os.path.join(out, submission.RESULTS_FILE), encoding="utf-8") as f:
            self.assertEqual(json.load(f), result["predict"])
        self.assertEqual(sorted(result["predict"]["files"]), ["CoLA.tsv", "SST-2.tsv"])
        self.assertEqual(result["predict"]["missing"], [])
        for task, name in (("sst2", "SST-2.tsv"), ("cola", "CoLA.tsv")):
            dev = _no_label(os.path.join(out, f"predictions_{task}_validation.tsv"), GLUE[task].label_words)
            self.assertEqual((evals[f"{task}/no_label"], evals[f"{task}/no_label_share"]), (dev, dev / 24))
            test = _no_label(os.path.join(out, f"predictions_{task}_test.tsv"), GLUE[task].label_words)
            rows = made_data.SIZES["test"]
            self.assertEqual(result["predict"]["files"][name],
                             {"rows": rows, "no_label": test, "no_label_share": test / rows,
                              "written_as": result["predict"]["files"][name]["written_as"]})

        # The rows trained on: 6 steps of 8, each row of its task's 100 (--max_train_samples), at the rates.
        with open(os.path.join(out, mixture.ROWS_FILE), encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        self.assertLen(rows, 48)
        self.assertTrue(all(0 <= int(row["row"]) < 100 for row in rows))
        with open(os.path.join(out, mixture.RATES_FILE), encoding="utf-8") as f:
            rates = json.load(f)
        self.assertEqual(rates["sst2"]["configured_rate"], 0.5)  # two tasks of 100 rows: equal at any T
        self.assertEqual(rates["sst2"]["rows_trained"], sum(row["task"] == "sst2" for row in rows))

        # Evaluating the exported model alone (--do_train false) gives the run's final results.
        again = fine_tune_t5.main(mixture_args(os.path.join(self.dir, "eval"), "--do_train", "false",
                                               "--model_name_or_path", os.path.join(out, "final"),
                                               "--eval_decoding", "score"))
        for key in ("sst2/accuracy", "cola/matthews_corrcoef", "glue_score"):
            self.assertEqual(again["eval"][key], evals[key], key)


class ResumeAnotherMixtureTest(fixtures.TempDirTestCase):

    def test_a_checkpoint_of_another_mixture_is_refused_in_one_line(self):
        out = os.path.join(self.dir, "run")
        fine_tune_t5.main(mixture_args(out, "--max_steps", "2", "--max_eval_samples", "8"))
        recorded = run_dir.read_state(out)["mixture"]
        self.assertEqual((recorded["tasks"], recorded["rates"], recorded["epoch_rows"]), (["sst2", "cola"], [0.5, 0.5],
                                                                                          200))
        before = fixtures.snapshot(out)
        # The same two tasks in the other order draw other rows at the same position.
        args = mixture_args(out, "--max_steps", "4", "--max_eval_samples", "8", "--resume_from_checkpoint", "auto")
        args[args.index("sst2,cola")] = "cola,sst2"
        with self.assertRaisesRegex(UsageError, r"step-000002 was trained on another mixture \(sst2 50.00% of 100, "
                                                r"cola 50.00% of 100\) than this run's \(cola 50.00% of 100, sst2"):
            fine_tune_t5.main(args)
        self.assertEqual(fixtures.snapshot(out), before)


class TwoProcessShardTest(fixtures.TempDirTestCase):

    def test_two_gloo_processes_train_the_mixture_like_one_with_twice_the_batch(self):
        common = ["--max_steps", "4", "--dropout_rate", "0", "--max_eval_samples", "8", "--mixing", "temperature",
                  "--mixing_temperature", "2", "--max_train_samples", "60"]
        two, one = os.path.join(self.dir, "two"), os.path.join(self.dir, "one")
        processes.run_two(os.path.join(fixtures.REPO, "fine_tune_t5.py"),
                          mixture_args(two, "--per_device_train_batch_size", "4", *common))
        fine_tune_t5.main(mixture_args(one, "--per_device_train_batch_size", "8", *common))
        # Step by step the loss of the same 8 rows: the two processes were dealt disjoint halves of
        # what one process trains on (the same rows twice, or another step's, would change it).
        for step, (a, b) in enumerate(zip(run_dir.read_losses(two), run_dir.read_losses(one)), start=1):
            self.assertAlmostEqual(a, b, delta=1e-4 * abs(b), msg=f"step {step}")
        # The same rows of the same tasks, and every task's dev rows evaluated once.
        with open(os.path.join(two, mixture.ROWS_FILE), encoding="utf-8") as f, \
                open(os.path.join(one, mixture.ROWS_FILE), encoding="utf-8") as g:
            self.assertEqual(f.read(), g.read())
        with open(os.path.join(two, "predictions_cola_validation.tsv"), encoding="utf-8") as f:
            self.assertLen(f.readlines(), 9)


if __name__ == "__main__":
    absltest.main()
