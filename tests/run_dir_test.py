"""run_dir: saving into a run folder, and the one reader of it, on folders laid out as a run leaves them."""
import json
import os
import tempfile
from unittest import mock

import accelerate
import torch
from absl.testing import absltest

from t5_training import checkpoint, loop, run_dir
from t5_training.config import TrainingConfig
from t5_training.errors import DivergedError
from tests import fixtures


def _write(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(value if isinstance(value, str) else json.dumps(value))


def _checkpoint(out, step, losses, complete=True):
    path = checkpoint.checkpoint_dir(out, step)
    state = {"step": step, "losses": losses, "evals": [{"step": step, "accuracy": 50.0 + step}]}
    _write(os.path.join(path, checkpoint.STATE_FILE), state)
    if complete:  # the manifest, written last, lists every file with its size
        size = os.path.getsize(os.path.join(path, checkpoint.STATE_FILE))
        _write(os.path.join(path, checkpoint.MANIFEST), {"step": step, "files": {checkpoint.STATE_FILE: size}})


class RunDirTest(fixtures.TempDirTestCase):

    def test_newest_complete_checkpoint_is_read(self):
        _checkpoint(self.dir, 2, [3.0, 2.5])
        _checkpoint(self.dir, 10, [3.0, 2.5, 2.0, 1.5])
        _checkpoint(self.dir, 12, [9.9], complete=False)  # killed while saving: never read as the newest
        self.assertEqual(run_dir.read_losses(self.dir), [3.0, 2.5, 2.0, 1.5])
        self.assertEqual(run_dir.read_evals(self.dir), [{"step": 10, "accuracy": 60.0}])
        self.assertEqual(run_dir.read_losses(self.dir, step=2), [3.0, 2.5])

    def test_a_checkpoint_rotated_away_while_reading_falls_back_to_the_next(self):
        _checkpoint(self.dir, 2, [3.0])
        _checkpoint(self.dir, 4, [3.0, 2.0])
        os.remove(os.path.join(checkpoint.checkpoint_dir(self.dir, 4), checkpoint.STATE_FILE))
        # Its state file is gone (rotated away by the live run): the next newest is read instead.
        self.assertEqual(run_dir.read_losses(self.dir), [3.0])

    def test_an_empty_or_missing_folder_has_no_history(self):
        self.assertIsNone(run_dir.read_state(self.dir))
        self.assertEqual(run_dir.read_losses(os.path.join(self.dir, "absent")), [])
        self.assertEqual(run_dir.read_evals(self.dir), [])

    def test_results_only_of_a_finished_run(self):
        _write(os.path.join(self.dir, "eval_results.json"), {"accuracy": 81.0})
        self.assertEqual(run_dir.read_final_eval(self.dir), {"accuracy": 81.0})
        self.assertIsNone(run_dir.read_results(self.dir))  # no final export, no train results
        _write(os.path.join(self.dir, "final", "config.json"), {})
        self.assertIsNone(run_dir.read_results(self.dir))
        _write(os.path.join(self.dir, "train_results.json"), {"train_steps": 4})
        self.assertEqual(run_dir.read_results(self.dir), {"train": {"train_steps": 4}, "eval": {"accuracy": 81.0}})
        _write(os.path.join(self.dir, "train_results.json"), '{"train_steps": 4')  # half-written
        self.assertIsNone(run_dir.read_results(self.dir))


class SaveTest(absltest.TestCase):
    def test_non_finite_weights_are_never_saved(self):
        model = torch.nn.Linear(2, 2)
        run_dir.ensure_finite_weights(model, "here")
        with torch.no_grad():
            model.weight[0, 0] = float("inf")
        with tempfile.TemporaryDirectory() as out:
            with self.assertRaisesRegex(DivergedError, "not finite at step 3, so they were not saved"):
                run_dir.save(mock.Mock(), TrainingConfig(output_dir=out), model, None, loop.TrainState(step=3))
            self.assertEqual(os.listdir(out), [])

    def test_rotation_keeps_the_best_checkpoint_beside_the_newest(self):
        # save_total_limit 1 keeps only the newest, except the best evaluation's checkpoint, which
        # `save` passes on from state.best_step: the run's best weights must outlive rotation.
        with tempfile.TemporaryDirectory() as out:
            accelerator = accelerate.Accelerator(cpu=True)
            config = TrainingConfig(output_dir=out, save_total_limit=1)
            model = torch.nn.Linear(2, 2)
            for step in (2, 4, 6):
                run_dir.save(accelerator, config, model, None, loop.TrainState(step=step, best_step=2))
            # Step 4 (neither the newest nor the best) was rotated away; step 2 survived two saves.
            self.assertEqual([os.path.basename(p) for p in checkpoint.list_checkpoints(out)],
                             ["step-000002", "step-000006"])
            self.assertEqual(sorted(n for n in os.listdir(out) if n.startswith("step-")),
                             ["step-000002", "step-000006"])
            self.assertEqual(run_dir.read_state(out, step=2)["best_step"], 2)


if __name__ == "__main__":
    absltest.main()
