"""The kill-and-resume machinery itself: runs compared bitwise, kill points drawn and ordered as promised.

Real runs killed and resumed through it are tests/kill_resume_test.py.
"""
from __future__ import annotations

import os
import tempfile

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




class ScenarioShapesTest(absltest.TestCase):
    """The short runs set around the caller's data: the same for the tests and the benchmark."""

    def test_fine_tune_scenario_adds_the_short_run_and_then_the_extra_flags(self):
        scenario = kill_runs.fine_tune_scenario(["--dataset_name", "sst2"], "--peft", "lora")
        self.assertEqual(scenario.name, "fine_tune --peft lora")
        self.assertEqual(scenario.script, "fine_tune_t5.py")
        self.assertEqual(scenario.args, ("--dataset_name", "sst2", "--max_train_samples", "64", "--max_eval_samples",
                                         "16", "--per_device_train_batch_size", "4", "--dropout_rate", "0.1",
                                         "--peft", "lora"))
        command = scenario.command("OUT")
        self.assertEqual(command[1], os.path.join(kill_runs.REPO, "fine_tune_t5.py"))
        self.assertEqual(command[command.index("--output_dir") + 1], "OUT")

    def test_pre_train_scenario_streams_when_asked(self):
        packed = kill_runs.pre_train_scenario("C", "H", "TOK", "CFG")
        streamed = kill_runs.pre_train_scenario("C", "H", "TOK", "CFG", True, "--objective", "ul2")
        self.assertEqual((packed.name, streamed.name), ("pre_train", "pre_train_streaming --objective ul2"))
        self.assertEqual(streamed.args[:len(packed.args)], packed.args)
        self.assertEqual(streamed.args[len(packed.args):],
                         ("--streaming", "--shuffle_buffer_size", "16", "--objective", "ul2"))
        self.assertEqual(packed.args[:8], ("--config_name", "CFG", "--tokenizer_name", "TOK", "--train_file", "C",
                                           "--validation_file", "H"))

    def test_corpus_slice_keeps_200_lines_and_holds_out_the_next_40(self):
        with tempfile.TemporaryDirectory() as folder:
            source = os.path.join(folder, "source.txt")
            with open(source, "w", encoding="utf-8") as f:
                f.writelines(f"line {i}\n\n" for i in range(300))  # blank lines are skipped
            corpus, held_out = kill_runs.corpus_slice(source, folder)
            with open(corpus, encoding="utf-8") as f:
                self.assertEqual(f.read(), "".join(f"line {i}\n" for i in range(200)))
            with open(held_out, encoding="utf-8") as f:
                self.assertEqual(f.read(), "".join(f"line {i}\n" for i in range(200, 240)))


if __name__ == "__main__":
    absltest.main()
