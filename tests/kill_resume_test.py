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

from absl.testing import absltest, parameterized

from t5_training import denoisers
from t5_training import mixture
from tests import fixtures, kill_harness


class _KillResumeCase(fixtures.TempDirTestCase):

    def _check(self, scenario, points):
        """A run killed at each point in turn (and resumed after each) ends exactly as the reference."""
        reference = kill_harness.reference_run(scenario, os.path.join(self.dir, "reference"), in_process=True)
        self.assertLen(reference.losses, scenario.max_steps)
        resumed = kill_harness.kill_in_turn(scenario, os.path.join(self.dir, "killed"), points)
        self.assertIsNone(kill_harness.first_difference(reference, resumed))


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
        reference = kill_harness.outcome(os.path.join(self.dir, "reference")).eval_results
        # 8 held-out chunks: the denoisers drawn for them (four here) each have a loss.
        reported = {key for key in reference if key.endswith("/loss")}
        self.assertGreaterEqual(len(reported), 2)
        self.assertContainsSubset(reported, {f"{d.name}/loss" for d in denoisers.UL2_DENOISERS})


class StreamingKillResumeTest(_KillResumeCase):

    def test_pre_train_streaming(self):
        # A stream is re-read and the consumed batches skipped (README, "What resume restores").
        self._check(kill_harness.pre_train_scenario(self.dir, streaming=True), ["micro:9:2", "save:8"])


class HarnessTest(parameterized.TestCase):
    """The harness itself: a difference must be found, and the points must be the ones promised."""

    def test_first_difference_finds_a_changed_loss_and_weight(self):
        import torch
        ref = kill_harness.Outcome([1.0, 0.5], {"w": torch.zeros(2)}, {"loss": 1})
        self.assertIsNone(kill_harness.first_difference(ref, kill_harness.Outcome([1.0, 0.5], {"w": torch.zeros(2)},
                                                                                   {"loss": 1})))
        self.assertIn("step 2", kill_harness.first_difference(
            ref, kill_harness.Outcome([1.0, 0.5000001], {"w": torch.zeros(2)}, {"loss": 1})))
        self.assertIn("weight w", kill_harness.first_difference(
            ref, kill_harness.Outcome([1.0, 0.5], {"w": torch.tensor([0.0, 1e-30])}, {"loss": 1})))

    @parameterized.parameters(0, 1, 2)
    def test_random_points_cover_accumulation_evaluation_and_saving(self, seed):
        scenario = kill_harness.Scenario("x", "x.py", ())
        points = kill_harness.random_points(scenario, 10, seed)
        self.assertLen(set(points), 10)
        self.assertTrue(any(p.startswith("micro:") and p.endswith(":1") for p in points))
        self.assertTrue(any(p.startswith("eval:") for p in points))
        self.assertTrue(any(p.startswith("save:") for p in points))
        self.assertTrue(all(p in scenario.kill_points() for p in points))

    def test_points_are_killed_in_the_order_a_run_reaches_them(self):
        scenario = kill_harness.Scenario("x", "x.py", ())
        points = ["save:6", "eval:8", "micro:8:2", "micro:7:1", "save:8", "micro:8:1"]
        self.assertEqual(sorted(points, key=scenario.position),
                         ["save:6", "micro:7:1", "micro:8:1", "micro:8:2", "eval:8", "save:8"])

    def test_expected_resume_step(self):
        scenario = kill_harness.Scenario("x", "x.py", (), save_steps=2)
        self.assertEqual([scenario.expected_resume_step(p) for p in ("micro:3:1", "save:4", "eval:8", "micro:12:2")],
                         [2, 2, 6, 10])


if __name__ == "__main__":
    absltest.main()
