"""Exact resume after SIGKILL: a run killed anywhere and resumed with `auto` equals a run never killed.

Bitwise on CPU: the per-step losses (every step, the resumed ones included), the final weights
and the evaluation results. Both scripts, the pretraining corpus packed in memory and streamed,
UL2's mixture of denoisers, and a fine-tuning mixture of three GLUE tasks.
Kill points cover mid-accumulation, mid-evaluation and mid-save. Each test kills one run at each of
its points in turn, resuming after every kill, so that later kills land in resumed runs;
`benchmarks/random_kills.py` runs ten random points per script, each in a fresh run.
"""
from __future__ import annotations

import os

from absl.testing import absltest

from t5_training import denoisers, kill_runs, mixture
from tests import fixtures, kill_harness


class _KillResumeCase(fixtures.TempDirTestCase):

    def _check(self, scenario, points):
        """A run killed at each point in turn (and resumed after each) ends exactly as the reference."""
        reference = kill_runs.reference_run(scenario, os.path.join(self.dir, "reference"), in_process=True)
        self.assertLen(reference.losses, scenario.max_steps)
        resumed = kill_runs.kill_in_turn(scenario, os.path.join(self.dir, "killed"), points)
        self.assertIsNone(kill_runs.first_difference(reference, resumed))


# One class per script: the test runner spreads classes over its workers.
class FineTuneKillResumeTest(_KillResumeCase):

    def test_fine_tune(self):
        # Mid-accumulation (micro-batch 1 of 2), during an evaluation, and while a checkpoint is written.
        self._check(kill_harness.fine_tune_scenario(), ["micro:7:1", "eval:8", "save:6"])


class AdapterKillResumeTest(_KillResumeCase):

    def test_fine_tune_with_lora(self):
        # The checkpoints hold the adapter and its optimizer state only; the frozen base comes
        # from the starting model again (--config_name with the same seed here).
        self._check(kill_harness.fine_tune_scenario("--peft", "lora", "--lora_dropout", "0.1"),
                    ["micro:7:1"])


class MixtureKillResumeTest(_KillResumeCase):

    def test_fine_tune_on_a_mixture(self):
        # The mixture's position is the loop's data position: a resumed run draws the same rows of
        # the same tasks, so its losses, weights and per-task evaluations are bitwise the same, and
        # so is the list of rows it trained on.
        scenario = kill_harness.fine_tune_scenario(
            "--dataset_name", "sst2,cola,stsb", "--data_dir", fixtures.glue_dir(), "--mixing", "temperature",
            "--mixing_temperature", "2", "--group_by_length")
        self._check(scenario, ["micro:7:1", "eval:8"])
        with open(os.path.join(self.dir, "reference", mixture.ROWS_FILE), encoding="utf-8") as f:
            reference = f.read()
        self.assertLen(reference.splitlines(), 1 + 12 * 2 * 4)
        with open(os.path.join(self.dir, "killed", mixture.ROWS_FILE), encoding="utf-8") as f:
            self.assertEqual(f.read(), reference)


class PreTrainKillResumeTest(_KillResumeCase):

    def test_pre_train(self):
        self._check(kill_harness.pre_train_scenario(self.dir), ["micro:5:1", "save:10", "eval:4"])


class UL2KillResumeTest(_KillResumeCase):

    def test_pre_train_with_the_mixture_of_denoisers(self):
        # Each row's denoiser is drawn from (seed, chunk ids), like its masks: mid-accumulation, the
        # resumed run draws the same denoisers, and its per-denoiser evaluations are bitwise the same.
        scenario = kill_harness.pre_train_scenario(self.dir, False, "--objective", "ul2")
        self._check(scenario, ["micro:7:1"])
        reference = kill_runs.outcome(os.path.join(self.dir, "reference")).eval_results
        # 8 held-out chunks: the denoisers drawn for them (four here) each have a loss.
        reported = {key for key in reference if key.endswith("/loss")}
        self.assertGreaterEqual(len(reported), 2)
        self.assertContainsSubset(reported, {f"{d.name}/loss" for d in denoisers.UL2_DENOISERS})


class StreamingKillResumeTest(_KillResumeCase):

    def test_pre_train_streaming(self):
        # A stream is re-read and the consumed batches skipped (README, "What resume restores").
        self._check(kill_harness.pre_train_scenario(self.dir, streaming=True), ["micro:9:2", "save:8"])


if __name__ == "__main__":
    absltest.main()
