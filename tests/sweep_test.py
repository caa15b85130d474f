"""W&B sweep YAMLs (sweeps/) and the offline sweep runner (t5_training.tools.sweep).

Every shipped sweep is checked against W&B's own schema and against the code it drives: its
parameters and command words are fine_tune_t5.py flags that parse, its metric is a key the run
logs for its task. The runner runs for real: three trials of the tiny T5 on SST-2, two from
`python -m t5_training.sweep` and one from the Slurm array script, proposed by W&B's bayes
engine from the shipped SST-2 search space, read back from the runs and ranked.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import multiprocessing
import os
import subprocess
import sys
import unittest

import yaml
from absl.testing import absltest, parameterized
from absl.testing.absltest import mock

import fine_tune_t5
from t5_training.registry import DATASET_VALS
from t5_training import checkpoint, mixture, tasks
from t5_training.config import parse_config
from t5_training.errors import EXIT_USAGE, run_cli
from t5_training.tools.sweep import cli, command, engine, schema
from t5_training.tools.sweep import config as runner_config
from t5_training.tools.sweep import state as sweep_state
from tests import fixtures

sweeps = engine.sweeps  # W&B's engine, imported there without its pydantic warnings
if sweeps is None:
    # Not a dependency (it pins numpy<2): skipped, naming the install, rather than failing on an
    # attribute of whatever else `import sweeps` found. tests/sweep_dependency_test.py runs without it.
    raise unittest.SkipTest(f"tests/sweep_test.py needs W&B's sweeps package: {engine.INSTALL_SWEEPS}")
SWEEPS_DIR = os.path.join(fixtures.REPO, "sweeps")
GLUE = DATASET_VALS["glue"]
FLAGS = {field.name for field in dataclasses.fields(fine_tune_t5.FineTuneConfig)}
# Every shipped sweep and its GLUE task: one per task, the adapter sweeps, and the mixture of all tasks.
SHIPPED = {**{f"glue_{task}.yaml": task for task in GLUE}, "lora_sst2.yaml": "sst2", "glue_mixture.yaml": "all"}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def logged_eval_keys(entry, prefix: str = "") -> set[str]:
    """The eval/ keys fine_tune_t5.py logs for a task (`prefix`: "<task>/" in a mixture): its metrics and loss."""
    return {f"eval/{prefix}{tasks.metric_key(entry, split, name)}" for split in entry.eval_splits
            for name in (*entry.metrics, "loss")}


def objective(task: str) -> tuple[dict, set[str]]:
    """A sweep's expected `metric:` for its --dataset_name, and every eval/ key such a run logs."""
    if task in GLUE:
        entry = GLUE[task]
        return ({"name": f"eval/{entry.metric_to_optimize}", "goal": "maximize" if entry.greater_is_better
                 else "minimize"}, logged_eval_keys(entry))
    names = mixture.task_names(GLUE, task)
    keys = {"eval/glue_score"}.union(*(logged_eval_keys(GLUE[name], f"{name}/") for name in names))
    return {"name": "eval/glue_score", "goal": "maximize"}, keys


class ShippedSweepsTest(parameterized.TestCase):

    def test_one_sweep_per_glue_task_and_the_adapter_sweeps(self):
        shipped = sorted(name for name in os.listdir(SWEEPS_DIR) if name.endswith(".yaml"))
        self.assertEqual(shipped, sorted(SHIPPED))

    @parameterized.named_parameters((name.removesuffix(".yaml"), name, task) for name, task in SHIPPED.items())
    def test_sweep_matches_the_script_and_the_task(self, name, task):
        sweep = load(os.path.join(SWEEPS_DIR, name))
        self.assertEqual(sweeps.schema_violations_from_proposed_config(sweep), [])
        sweeps.SweepConfig(sweep)  # W&B's full validation, defaults filled in
        self.assertEqual(schema.load_sweep(os.path.join(SWEEPS_DIR, name)), sweep)

        params = sweep["parameters"]
        self.assertContainsSubset(params, FLAGS)
        self.assertEqual((params["benchmark"], params["dataset_name"]), ({"value": "glue"}, {"value": task}))
        self.assertContainsSubset({"learning_rate", "lr_scheduler_type", "warmup_ratio"},
                                  schema.searched(sweep))
        self.assertEqual(params["learning_rate"]["distribution"], "log_uniform_values")

        metric, logged = objective(task)
        self.assertEqual(sweep["metric"], metric)
        self.assertIn(sweep["metric"]["name"], logged)

        # List form with accelerate launch: one string would be run as one program name (wandb#4135).
        self.assertEqual(sweep["command"][:4], ["accelerate", "launch", "${program}", "${args}"])
        self.assertEqual(sweep["program"], "fine_tune_t5.py")
        if "early_terminate" in sweep:
            # Hyperband counts evaluations; the offline runner sees each in its checkpoint.
            self.assertEqual(params["save_steps"], params["eval_steps"])

    def test_lora_sweep_searches_rank_and_learning_rate_over_t5_layers(self):
        sweep = load(os.path.join(SWEEPS_DIR, "lora_sst2.yaml"))
        self.assertEqual(sweep["parameters"]["peft"], {"value": "lora"})
        self.assertContainsSubset({"lora_r", "lora_alpha", "learning_rate"}, schema.searched(sweep))
        # Every target list names layers t5-small has (an unknown one would fail the trial at start).
        t5_linear = {"q", "k", "v", "o", "wi", "wo"}
        for targets in sweep["parameters"]["lora_target_modules"]["values"]:
            self.assertContainsSubset(targets.split(","), t5_linear)

    @parameterized.named_parameters((name.removesuffix(".yaml"), name, task) for name, task in SHIPPED.items())
    def test_agent_command_parses_as_fine_tune_flags(self, name, task):
        sweep = load(os.path.join(SWEEPS_DIR, name))
        trial = {"params": engine.propose(sweep, [], seed=0)}
        with mock.patch.dict(os.environ, {"SLURM_JOB_ID": "4242"}):
            words = command.trial_command(sweep, trial, "runs/x/trial-000", ())
        self.assertEqual(words[:3], ["accelerate", "launch", "fine_tune_t5.py"])
        runner_flags = ["--output_dir=runs/x/trial-000", "--overwrite_output_dir=true", "--resume_from_checkpoint=auto"]
        self.assertEqual(words[-3:], runner_flags)
        # What a W&B agent runs (without the offline runner's own last three flags).
        agent = parse_config(fine_tune_t5.FineTuneConfig, words[3:-3])
        self.assertEqual(agent.output_dir, f"runs/sweep_{name.removesuffix('.yaml')}/job-4242")
        self.assertTrue(agent.overwrite_output_dir)
        self.assertEqual((agent.dataset_name, agent.report_to), (task, "wandb"))
        self.assertIs(type(trial["params"]["learning_rate"]), float)  # not np.float64
        self.assertEqual(agent.learning_rate, trial["params"]["learning_rate"])
        # Every value a categorical parameter may take is accepted by the script, beside the sweep's
        # fixed parameters (which the agent always passes, e.g. --peft=lora for --use_dora).
        fixed = [f"--{key}={spec['value']}" for key, spec in sweep["parameters"].items() if "value" in spec]
        for name in schema.searched(sweep):
            for value in sweep["parameters"][name].get("values", []):
                flags = [*fixed, f"--dataset_name={task}", f"--{name}={value}"]
                self.assertEqual(getattr(parse_config(fine_tune_t5.FineTuneConfig, flags), name), value)


class SearchTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        self.sweep = load(os.path.join(SWEEPS_DIR, "glue_sst2.yaml"))

    def test_proposals_are_reproducible_and_leave_global_rngs_alone(self):
        import random

        import numpy as np

        random.seed(5), np.random.seed(5)
        expected = random.random(), np.random.random()
        random.seed(5), np.random.seed(5)
        first = engine.propose(self.sweep, [], seed=3)
        self.assertEqual((random.random(), np.random.random()), expected)
        self.assertEqual(engine.propose(self.sweep, [], seed=3), first)
        self.assertNotEqual(engine.propose(self.sweep, [], seed=4), first)
        json.dumps(first)

    def test_hyperband_stops_a_trial_below_the_others_at_its_third_evaluation(self):
        def trial(name, state, accuracies):
            history = [{"_step": 300 * (i + 1), "eval/accuracy": a} for i, a in enumerate(accuracies)]
            return {"name": name, "state": state, "params": {"learning_rate": 1e-4}, "history": history,
                    "summary": {}}

        trials = [trial("a", "finished", [50, 60, 70, 72]), trial("b", "finished", [55, 65, 75, 77]),
                  trial("c", "stopped", [52, 62, 72]), trial("behind", "running", [10, 20, 30]),
                  trial("ahead", "running", [60, 70, 80]), trial("early", "running", [1, 2])]
        # min_iter 3, eta 2: at the 3rd evaluation the bottom half is stopped; "early" has no band yet.
        self.assertEqual([t["name"] for t in trials if engine.should_stop(self.sweep, trials, t["name"])],
                         ["behind"])


def _claim(output_dir, sweep_file, queue):
    config = runner_config.RunnerConfig(sweep_file=sweep_file, output_dir=output_dir)
    queue.put(sweep_state.claim_trial(config, schema.load_sweep(sweep_file)))


class SharedStateTest(fixtures.TempDirTestCase):

    def test_concurrent_runners_claim_distinct_trials_and_a_dead_runners_trial_is_resumed(self):
        sweep_file = os.path.join(SWEEPS_DIR, "glue_sst2.yaml")
        out = os.path.join(self.dir, "sweep")
        config = runner_config.RunnerConfig(sweep_file=sweep_file, output_dir=out)
        sweep_state.start_sweep(config, load(sweep_file))
        # Four Slurm array tasks starting at once, as four processes on one lock.
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        workers = [context.Process(target=_claim, args=(out, sweep_file, queue)) for _ in range(4)]
        for worker in workers:
            worker.start()
        claimed = [queue.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join()
        self.assertCountEqual([t["name"] for t in claimed], [f"trial-{i:03d}" for i in range(4)])
        self.assertLen({t["params"]["learning_rate"] for t in claimed}, 4)
        # Those runners are gone with their trials unfinished: the next runner resumes the first.
        again = sweep_state.claim_trial(config, load(sweep_file))
        self.assertEqual((again["name"], again["starts"], again["params"]),
                         ("trial-000", 2, next(t for t in claimed if t["name"] == "trial-000")["params"]))


class UsageTest(fixtures.TempDirTestCase):

    def write(self, name, changes):
        sweep = {**load(os.path.join(SWEEPS_DIR, "glue_sst2.yaml")), **changes}
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(sweep, f)
        return path

    def run_cli(self, *argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = run_cli(cli.main, list(argv))
        return code, err.getvalue()

    @parameterized.named_parameters(
        ("no_output_dir", [], "the following arguments are required: --output_dir"),
        ("zero_count", ["--output_dir", "out", "--count", "0"], "--count must be at least 1"),
        ("swept_flag_after_dashes", ["--output_dir", "out", "--", "--learning_rate=1e-3"],
         "--learning_rate after -- would override"),
        ("runner_flag_after_dashes", ["--output_dir", "out", "--", "--output_dir", "x"],
         "--output_dir after -- would override"),
    )
    def test_bad_flags(self, words, message):
        words = [os.path.join(self.dir, w) if w == "out" else w for w in words]
        code, err = self.run_cli(os.path.join(SWEEPS_DIR, "glue_sst2.yaml"), *words)
        self.assertEqual(code, EXIT_USAGE)
        self.assertLen(err.strip().splitlines(), 1, err)
        self.assertIn(message, err)

    @parameterized.named_parameters(
        ("one_string_command", {"command": "accelerate launch ${program} ${args}"}, "wandb#4135"),
        ("train_metric", {"metric": {"name": "train/loss", "goal": "minimize"}}, "must be an evaluation key"),
        ("schema", {"method": "annealing"}, "is not a valid W&B sweep"),
    )
    def test_bad_sweep_files(self, changes, message):
        code, err = self.run_cli(self.write("bad.yaml", changes), "--output_dir", os.path.join(self.dir, "out"))
        self.assertEqual(code, EXIT_USAGE)
        self.assertLen(err.strip().splitlines(), 1, err)
        self.assertIn(message, err)

    def test_an_output_dir_holds_one_sweep(self):
        out = os.path.join(self.dir, "out")
        first = self.write("a.yaml", {})
        self.assertEqual(self.run_cli(first, "--output_dir", out, "--slurm")[0], 0)
        code, err = self.run_cli(self.write("b.yaml", {"method": "random"}), "--output_dir", out)
        self.assertEqual(code, EXIT_USAGE)
        self.assertIn("holds another sweep", err)

    def test_slurm_prints_the_array_job(self):
        out = os.path.join(self.dir, "out")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            cli.main([os.path.join(SWEEPS_DIR, "glue_sst2.yaml"), "--output_dir", out, "--count", "10",
                      "--parallel", "4", "--slurm", "--", "--data_dir", "data/SST-2"])
        script = os.path.relpath(os.path.join(fixtures.REPO, "slurm", "sweep_offline.sbatch"))
        self.assertEqual(printed.getvalue().split(), ["sbatch", "--array=0-9%4", script,
                                                      os.path.join(SWEEPS_DIR, "glue_sst2.yaml"), out, "--",
                                                      "--data_dir", "data/SST-2"])
        with open(os.path.join(out, sweep_state.STATE_FILE), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["extra"], ["--data_dir", "data/SST-2"])
        self.assertEqual(subprocess.run(["bash", "-n", script]).returncode, 0)


class OfflineSweepTest(fixtures.TempDirTestCase):
    """Three real trials: two from `python -m t5_training.sweep`, one from the Slurm array script."""

    def tiny_sweep(self) -> str:
        """The shipped SST-2 sweep (search space, method, hyperband, command) on the tiny model for a few steps."""
        sweep = load(os.path.join(SWEEPS_DIR, "glue_sst2.yaml"))
        args = fixtures.fine_tune_args("unused", "--max_steps", "4", "--eval_steps", "2", "--save_steps", "2",
                                       "--report_to", "none")
        fixed = dict(zip(args[::2], args[1::2]))
        for flag in ("--output_dir", "--learning_rate"):
            del fixed[flag]
        params = {name: spec for name, spec in sweep["parameters"].items() if "value" not in spec}
        params.update({flag[2:]: {"value": value} for flag, value in fixed.items()})
        # Four steps teach the tiny model no label word (accuracy 0 for all), but they do move
        # the teacher-forced loss, so the ranking is checked on that.
        sweep.update(parameters=params, program=os.path.join(fixtures.REPO, "fine_tune_t5.py"),
                     metric={"name": "eval/loss", "goal": "minimize"})
        path = os.path.join(self.dir, "tiny_sst2.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(sweep, f)
        return path

    def test_three_trials_are_proposed_run_read_back_and_ranked(self):
        sweep_file, out = self.tiny_sweep(), os.path.join(self.dir, "sweep")
        # `accelerate` and `python` of this interpreter, as on a cluster node with the env activated.
        path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        with mock.patch.dict(os.environ, {"PATH": path, "OMP_NUM_THREADS": "1"}), \
                contextlib.redirect_stdout(io.StringIO()):
            rows = cli.main([sweep_file, "--count", "2", "--output_dir", out, "--poll_seconds", "1",
                             "--", "--max_eval_samples", "24"])
            self.assertLen(rows, 2)
            task = subprocess.run(["bash", os.path.join("slurm", "sweep_offline.sbatch"), sweep_file, out, "--",
                                   "--max_eval_samples", "24"], cwd=fixtures.REPO, capture_output=True, text=True,
                                  env={**os.environ, "SLURM_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "2"})
        self.assertEqual(task.returncode, 0, task.stderr[-3000:])

        with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
            results = json.load(f)
        trials = results["trials"]
        self.assertEqual(sorted(t["trial"] for t in trials), ["trial-000", "trial-001", "trial-002"])
        space = load(os.path.join(SWEEPS_DIR, "glue_sst2.yaml"))["parameters"]
        rates = [t["params"]["learning_rate"] for t in trials]
        self.assertLen(set(rates), 3)
        for t in trials:
            self.assertEqual(t["state"], "finished")
            self.assertBetween(t["params"]["learning_rate"], space["learning_rate"]["min"],
                               space["learning_rate"]["max"])
            self.assertIn(t["params"]["lr_scheduler_type"], space["lr_scheduler_type"]["values"])
            # Read back independently: the run trained with the proposed rate, and the table's
            # value is the best evaluation loss it recorded (on the 24 rows the flag after -- asked for).
            run_dir = os.path.join(out, t["trial"])
            with open(os.path.join(checkpoint.list_checkpoints(run_dir)[-1], checkpoint.STATE_FILE)) as f:
                state = json.load(f)
            self.assertEqual(state["scheduler"]["base_lrs"][0], t["params"]["learning_rate"])
            self.assertEqual([e["step"] for e in state["evals"]], [2, 4])
            best = min(state["evals"], key=lambda e: e["loss"])
            self.assertEqual((t["value"], t["step"]), (best["loss"], best["step"]))
            with open(os.path.join(run_dir, "eval_results.json")) as f:
                self.assertEqual(json.load(f)["loss"], state["evals"][-1]["loss"])
            with open(os.path.join(run_dir, "predictions_validation.tsv")) as f:
                self.assertLen(f.readlines(), 25)
        values = [t["value"] for t in trials]
        self.assertEqual(values, sorted(values))  # goal: minimize

        # The table printed at the end (here by the array task) ranks all three, best first.
        table = [line for line in task.stdout.splitlines() if line.startswith("|")]
        self.assertEqual(table[0].split(" | ")[:5], ["| rank", "trial", "state", "eval/loss", "at step"])
        for rank, (line, t) in enumerate(zip(table[2:], trials), start=1):
            self.assertEqual(line.split(" | ")[:5], [f"| {rank}", t["trial"], "finished", f"{t['value']:.4g}",
                                                     str(t["step"])])
        with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
            self.assertEqual(f.read().splitlines(), table)


if __name__ == "__main__":
    absltest.main()
