"""The kill-and-resume machinery itself: runs compared bitwise, kill points drawn and ordered as promised.

Real runs killed and resumed through it are tests/kill_resume_test.py.
"""
from __future__ import annotations

from absl.testing import absltest, parameterized

from t5_training import kill_runs


class KillRunsTest(parameterized.TestCase):
    """A difference must be found, and the points must be the ones promised."""

    def test_first_difference_finds_a_changed_loss_and_weight(self):
        import torch
        ref = kill_runs.Outcome([1.0, 0.5], {"w": torch.zeros(2)}, {"loss": 1})
        self.assertIsNone(kill_runs.first_difference(ref, kill_runs.Outcome([1.0, 0.5], {"w": torch.zeros(2)},
                                                                             {"loss": 1})))
        self.assertIn("step 2", kill_runs.first_difference(
            ref, kill_runs.Outcome([1.0, 0.5000001], {"w": torch.zeros(2)}, {"loss": 1})))
        self.assertIn("weight w", kill_runs.first_difference(
            ref, kill_runs.Outcome([1.0, 0.5], {"w": torch.tensor([0.0, 1e-30])}, {"loss": 1})))

    @parameterized.parameters(0, 1, 2)
    def test_random_points_cover_accumulation_evaluation_and_saving(self, seed):
        scenario = kill_runs.Scenario("x", "x.py", ())
        points = kill_runs.random_points(scenario, 10, seed)
        self.assertLen(set(points), 10)
        self.assertTrue(any(p.startswith("micro:") and p.endswith(":1") for p in points))
        self.assertTrue(any(p.startswith("eval:") for p in points))
        self.assertTrue(any(p.startswith("save:") for p in points))
        self.assertTrue(all(p in scenario.kill_points() for p in points))

    def test_points_are_killed_in_the_order_a_run_reaches_them(self):
        scenario = kill_runs.Scenario("x", "x.py", ())
        points = ["save:6", "eval:8", "micro:8:2", "micro:7:1", "save:8", "micro:8:1"]
        self.assertEqual(sorted(points, key=scenario.position),
                         ["save:6", "micro:7:1", "micro:8:1", "micro:8:2", "eval:8", "save:8"])

    def test_expected_resume_step(self):
        scenario = kill_runs.Scenario("x", "x.py", (), save_steps=2)
        self.assertEqual([scenario.expected_resume_step(p) for p in ("micro:3:1", "save:4", "eval:8", "micro:12:2")],
                         [2, 2, 6, 10])



if __name__ == "__main__":
    absltest.main()
