"""Tests for t5_training.checkpoint: atomic saves, resuming, rotation, output folders and exports."""

import collections
import json
import os
import re
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import accelerate
import torch
from accelerate.utils import DistributedType
from safetensors.torch import load_file

from t5_training import checkpoint
from t5_training import optim
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError, WriteError
from t5_training.loop import TrainState
from tests import fixtures


def _make_step_dir(output_dir, name, complete=True):
    path = os.path.join(output_dir, name)
    os.makedirs(path)
    with open(os.path.join(path, "weights.bin"), "w") as f:
        f.write(name)
    if complete:
        with open(os.path.join(path, checkpoint.MANIFEST), "w") as f:
            json.dump({"step": 0, "files": {"weights.bin": len(name)}}, f)
    return path



def _make_shards(path):
    os.makedirs(os.path.join(path, "pytorch_model"))
    for i in range(2):
        with open(os.path.join(path, "pytorch_model", f"shard_{i}.pt"), "w") as f:
            f.write("12345")


class _TmpDirTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.root = tmp.name
        self.out = os.path.join(self.root, "out")


class CheckpointDirTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("small", 7, "step-000007"),
        ("six_digits", 123456, "step-123456"),
        ("seven_digits", 1000000, "step-1000000"),
    )
    def test_checkpoint_dir(self, step, name):
        self.assertEqual(checkpoint.checkpoint_dir("/runs/x", step), os.path.join("/runs/x", name))


class ListCheckpointsTest(_TmpDirTest):

    def test_missing_dir_is_empty(self):
        self.assertEqual(checkpoint.list_checkpoints(self.out), [])

    def test_orders_by_step_and_skips_incomplete_and_others(self):
        os.makedirs(self.out)
        for name in ("step-000010", "step-1000000", "step-000009", "step-000100"):
            _make_step_dir(self.out, name)
        _make_step_dir(self.out, "step-000200", complete=False)
        truncated = _make_step_dir(self.out, "step-000250")
        with open(os.path.join(truncated, "weights.bin"), "w") as f:  # shorter than its manifest says
            f.write("step")
        missing = _make_step_dir(self.out, "step-000260")
        os.remove(os.path.join(missing, "weights.bin"))
        _make_step_dir(self.out, ".tmp-step-000300")
        _make_step_dir(self.out, "best-000400")
        with open(os.path.join(self.out, "step-000500"), "w") as f:  # a file, not a folder
            f.write("x")
        self.assertEqual(checkpoint.list_checkpoints(self.out),
                         [os.path.join(self.out, n) for n in ("step-000009", "step-000010", "step-000100",
                                                              "step-1000000")])


class ResolveResumeTest(_TmpDirTest):

    @parameterized.named_parameters(("none", None), ("empty", ""))
    def test_nothing_requested(self, value):
        os.makedirs(self.out)
        _make_step_dir(self.out, "step-000005")
        self.assertIsNone(checkpoint.resolve_resume(value, self.out))

    def test_auto_without_checkpoints(self):
        self.assertIsNone(checkpoint.resolve_resume("auto", self.out))  # folder does not exist
        os.makedirs(self.out)
        self.assertIsNone(checkpoint.resolve_resume("auto", self.out))
        _make_step_dir(self.out, "step-000003", complete=False)
        self.assertIsNone(checkpoint.resolve_resume("auto", self.out))

    def test_auto_picks_newest_complete(self):
        os.makedirs(self.out)
        _make_step_dir(self.out, "step-000009")
        _make_step_dir(self.out, "step-000010")
        _make_step_dir(self.out, "step-000008")
        _make_step_dir(self.out, "step-000011", complete=False)  # killed mid-save
        self.assertEqual(checkpoint.resolve_resume("auto", self.out), os.path.join(self.out, "step-000010"))

    def test_explicit_complete_path(self):
        os.makedirs(self.out)
        path = _make_step_dir(self.out, "step-000004")
        self.assertEqual(checkpoint.resolve_resume(path, self.out), path)

    def test_explicit_incomplete_path(self):
        os.makedirs(self.out)
        path = _make_step_dir(self.out, "step-000004", complete=False)
        with self.assertRaisesRegex(UsageError, "incomplete"):
            checkpoint.resolve_resume(path, self.out)

    def test_an_export_or_a_run_folder_is_named_for_what_it_is(self):
        os.makedirs(os.path.join(self.out, "final"))
        with open(os.path.join(self.out, "final", "config.json"), "w", encoding="utf-8") as f:
            f.write("{}")
        newest = _make_step_dir(self.out, "step-000004")
        _make_step_dir(self.out, "step-000002")
        with self.assertRaisesRegex(UsageError, "final is a model export, not a checkpoint .*--model_name_or_path"):
            checkpoint.resolve_resume(os.path.join(self.out, "final"), self.out)
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"--resume_from_checkpoint {self.out} is a run's output folder: pass 'auto' with "
                            f"--output_dir {self.out}, or one of its checkpoints, e.g. {newest}"):
            checkpoint.resolve_resume(self.out, self.out)

    def test_missing_path(self):
        path = os.path.join(self.root, "nowhere", "step-000004")
        with self.assertRaisesRegex(UsageError, "does not exist"):
            checkpoint.resolve_resume(path, self.out)

    def test_the_messages_say_what_to_pass(self):
        missing = os.path.join(self.root, "nowhere", "step-000004")
        with self.assertRaises(UsageError) as raised:
            checkpoint.resolve_resume(missing, self.out)
        self.assertEqual(str(raised.exception), f"--resume_from_checkpoint {missing!r} does not exist; pass a "
                         "step-NNNNNN folder or 'auto'")
        os.makedirs(self.out)
        partial = _make_step_dir(self.out, "step-000004", complete=False)
        with self.assertRaises(UsageError) as raised:
            checkpoint.resolve_resume(partial, self.out)
        self.assertEqual(str(raised.exception), f"--resume_from_checkpoint {partial} is incomplete or damaged (its "
                         "checkpoint.json is missing or lists files that are missing or truncated); pass an earlier "
                         "checkpoint or 'auto'")


class CheckIsACheckpointTest(_TmpDirTest):
    """--resume_from_checkpoint given a folder that is no checkpoint: named for what it is."""

    def test_checkpoint_files_are_recognised_complete_or_not(self):
        complete = _make_step_dir(self.root, "step-000002")
        partial = _make_step_dir(self.root, "step-000004", complete=False)
        with open(os.path.join(partial, checkpoint.STATE_FILE), "w", encoding="utf-8") as f:
            f.write("{}")
        for path in (complete, partial):
            self.assertTrue(checkpoint.has_checkpoint_files(path), path)
            checkpoint.check_is_a_checkpoint(path)  # no error: loading it judges whether it is whole
        self.assertFalse(checkpoint.has_checkpoint_files(self.root))

    def test_an_export_says_which_flag_takes_it(self):
        export = os.path.join(self.root, "final")
        os.makedirs(export)
        with open(os.path.join(export, "config.json"), "w", encoding="utf-8") as f:
            f.write("{}")
        message = (f"--resume_from_checkpoint {export} is a model export, not a checkpoint (no optimizer state or "
                   "data position): to train from its weights pass it as --model_name_or_path; to continue its "
                   "run pass one of the run's step-NNNNNN folders, or 'auto'")
        with self.assertRaisesRegex(UsageError, "^" + re.escape(message) + "$"):
            checkpoint.check_is_a_checkpoint(export)

    def test_a_run_folder_offers_auto_and_its_newest_checkpoint(self):
        os.makedirs(self.out)
        for name in ("step-000002", "step-000010", "step-000004"):
            _make_step_dir(self.out, name)
        newest = os.path.join(self.out, "step-000010")
        message = (f"--resume_from_checkpoint {self.out} is a run's output folder: pass 'auto' with --output_dir "
                   f"{self.out}, or one of its checkpoints, e.g. {newest}")
        with self.assertRaisesRegex(UsageError, "^" + re.escape(message) + "$"):
            checkpoint.check_is_a_checkpoint(self.out)


class RotateCheckpointsTest(_TmpDirTest):

    def _remaining(self):
        return sorted(os.listdir(self.out))

    def _fill(self, steps):
        os.makedirs(self.out)
        for step in steps:
            _make_step_dir(self.out, f"step-{step:06d}")

    @parameterized.named_parameters(
        ("keep_two", 2, None, ["step-000004", "step-000005"]),
        ("keep_one", 1, None, ["step-000005"]),
        ("keep_more_than_present", 9, None, ["step-000001", "step-000002", "step-000003", "step-000004",
                                             "step-000005"]),
        ("keep_all", 0, None, ["step-000001", "step-000002", "step-000003", "step-000004", "step-000005"]),
        ("best_is_old", 2, 2, ["step-000002", "step-000004", "step-000005"]),
        ("best_is_old_keep_one", 1, 1, ["step-000001", "step-000005"]),
        ("best_is_kept_anyway", 2, 5, ["step-000004", "step-000005"]),
        ("best_without_checkpoint", 2, 7, ["step-000004", "step-000005"]),
    )
    def test_rotation(self, keep, keep_step, expected):
        self._fill([1, 2, 3, 4, 5])
        checkpoint.rotate_checkpoints(self.out, keep, keep_step=keep_step)
        self.assertEqual(self._remaining(), expected)

    def test_numeric_order_and_other_folders_untouched(self):
        self._fill([9, 10, 1000000])
        _make_step_dir(self.out, "step-2000000", complete=False)
        _make_step_dir(self.out, "best")
        checkpoint.rotate_checkpoints(self.out, 1)
        self.assertEqual(self._remaining(), ["best", "step-1000000", "step-2000000"])

    def test_rotating_again_is_stable(self):
        self._fill([1, 2, 3])
        checkpoint.rotate_checkpoints(self.out, 2, keep_step=1)
        checkpoint.rotate_checkpoints(self.out, 2, keep_step=1)
        self.assertEqual(self._remaining(), ["step-000001", "step-000002", "step-000003"])

    def test_a_checkpoint_deleted_meanwhile_is_no_error(self):
        # Another process (or a user) removed the oldest between listing and deleting.
        self._fill([1, 2, 3])
        listed = checkpoint.list_checkpoints(self.out)
        shutil.rmtree(listed[0])
        with mock.patch.object(checkpoint, "list_checkpoints", return_value=listed):
            checkpoint.rotate_checkpoints(self.out, 1)
        self.assertEqual(self._remaining(), ["step-000003"])


class PrepareOutputDirTest(_TmpDirTest):

    def test_missing_dir_is_not_created_yet(self):
        # Creating it waits until every input is checked (run_dir.start_output_dir).
        self.assertIsNone(checkpoint.check_output_dir(self.out, overwrite=False, resume_from_checkpoint=None))
        self.assertFalse(os.path.exists(self.out))

    def test_empty_dir_is_fine(self):
        os.makedirs(self.out)
        self.assertIsNone(checkpoint.check_output_dir(self.out, overwrite=False, resume_from_checkpoint="auto"))
        self.assertEqual(os.listdir(self.out), [])

    def _fill(self):
        os.makedirs(self.out)
        _make_step_dir(self.out, "step-000002")
        _make_step_dir(self.out, "step-000004")
        _make_step_dir(self.out, "step-000006", complete=False)
        _make_step_dir(self.out, ".tmp-step-000008")
        _make_step_dir(self.out, "best")
        with open(os.path.join(self.out, "train_results.json"), "w") as f:
            f.write('{"train_loss": 1.5}')

    @parameterized.named_parameters(("no_resume", None), ("auto_without_checkpoint", "auto"))
    def test_non_empty_without_overwrite_refuses_and_keeps_everything(self, resume):
        os.makedirs(self.out)
        with open(os.path.join(self.out, "notes.txt"), "w") as f:
            f.write("precious")
        _make_step_dir(self.out, "step-000006", complete=False)
        before = fixtures.snapshot(self.out)
        with self.assertRaisesRegex(UsageError, "--overwrite_output_dir") as raised:
            checkpoint.check_output_dir(self.out, overwrite=False, resume_from_checkpoint=resume)
        self.assertIn(self.out, str(raised.exception))
        self.assertEqual(fixtures.snapshot(self.out), before)

    def test_overwrite_is_allowed_and_deletes_nothing_yet(self):
        self._fill()
        before = fixtures.snapshot(self.out)
        self.assertIsNone(checkpoint.check_output_dir(self.out, overwrite=True, resume_from_checkpoint=None))
        # Deleting waits until the run's inputs are checked (run_dir.start_output_dir).
        self.assertEqual(fixtures.snapshot(self.out), before)

    @parameterized.named_parameters(("without_overwrite", False), ("with_overwrite", True))
    def test_resume_auto_returns_checkpoint_and_deletes_nothing(self, overwrite):
        self._fill()
        before = fixtures.snapshot(self.out)
        resume = checkpoint.check_output_dir(self.out, overwrite=overwrite, resume_from_checkpoint="auto")
        self.assertEqual(resume, os.path.join(self.out, "step-000004"))
        self.assertEqual(fixtures.snapshot(self.out), before)

    def test_resume_explicit_path(self):
        self._fill()
        before = fixtures.snapshot(self.out)
        path = os.path.join(self.out, "step-000002")
        self.assertEqual(checkpoint.check_output_dir(self.out, overwrite=False, resume_from_checkpoint=path), path)
        self.assertEqual(fixtures.snapshot(self.out), before)

    @parameterized.named_parameters(
        ("no_resume", None, "is not empty; pass --overwrite_output_dir to start over there, --resume_from_checkpoint "
                            "auto to continue, or choose a new folder"),
        ("auto_without_checkpoint", "auto", "is not empty but holds no complete checkpoint to resume; add "
                                            "--overwrite_output_dir to start over there, or choose a new folder"))
    def test_the_refusals_say_what_to_pass(self, resume, message):
        os.makedirs(self.out)
        _make_step_dir(self.out, "step-000006", complete=False)
        with self.assertRaises(UsageError) as raised:
            checkpoint.check_output_dir(self.out, overwrite=False, resume_from_checkpoint=resume)
        self.assertEqual(str(raised.exception), f"--output_dir {self.out} {message}")

    def test_resume_incomplete_path_raises_before_deleting(self):
        self._fill()
        before = fixtures.snapshot(self.out)
        with self.assertRaisesRegex(UsageError, "incomplete"):
            checkpoint.check_output_dir(self.out, overwrite=True,
                                          resume_from_checkpoint=os.path.join(self.out, "step-000006"))
        self.assertEqual(fixtures.snapshot(self.out), before)


class SaveLoadTest(_TmpDirTest):

    def _accelerated(self, seed):
        accelerator = accelerate.Accelerator(cpu=True)
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        model, optimizer = accelerator.prepare(model, optimizer)
        return accelerator, model, optimizer

    def _train_one_step(self, model, optimizer):
        model(torch.ones(3, 4)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    def test_save_writes_complete_folder(self):
        accelerator, model, optimizer = self._accelerated(0)
        state = TrainState(step=7, epoch=1, samples_in_epoch=24, losses=[2.5, 2.0])
        path = checkpoint.save_checkpoint(accelerator, self.out, state)
        self.assertEqual(path, os.path.join(self.out, "step-000007"))
        self.assertEqual(os.listdir(self.out), ["step-000007"])  # no .tmp- left behind
        files = sorted(os.listdir(path))
        self.assertIn(checkpoint.MANIFEST, files)
        self.assertIn(checkpoint.STATE_FILE, files)
        with open(os.path.join(path, checkpoint.MANIFEST)) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["step"], 7)
        # The manifest lists every other file in the folder (subfolders included), with its size.
        self.assertEqual(sorted([*manifest["files"], checkpoint.MANIFEST]), files)
        for name, size in manifest["files"].items():
            self.assertEqual(os.path.getsize(os.path.join(path, name)), size)
        with open(os.path.join(path, checkpoint.STATE_FILE)) as f:
            saved = json.load(f)
        self.assertEqual(saved, state.state_dict())
        self.assertEqual((saved["step"], saved["epoch"], saved["samples_in_epoch"], saved["losses"]),
                         (7, 1, 24, [2.5, 2.0]))
        self.assertTrue(checkpoint.is_complete(path))
        self.assertEqual(checkpoint.list_checkpoints(self.out), [path])

    def test_manifest_of_an_earlier_version_lists_names_only(self):
        path = _make_step_dir(self.root, "step-000001")
        with open(os.path.join(path, checkpoint.MANIFEST), "w") as f:
            json.dump({"step": 1, "files": ["weights.bin"]}, f)
        self.assertTrue(checkpoint.is_complete(path))
        os.remove(os.path.join(path, "weights.bin"))
        self.assertFalse(checkpoint.is_complete(path))

    def test_manifest_covers_files_in_subfolders(self):
        # DeepSpeed writes its shards into a subfolder: a truncated shard must make the checkpoint incomplete.
        accelerator, model, optimizer = self._accelerated(0)
        with mock.patch.object(accelerator, "save_state", side_effect=lambda path: _make_shards(path)):
            path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=3))
        with open(os.path.join(path, checkpoint.MANIFEST)) as f:
            files = json.load(f)["files"]
        self.assertEqual(sorted(files), ["pytorch_model/shard_0.pt", "pytorch_model/shard_1.pt", "train_state.json"])
        self.assertEqual(files["pytorch_model/shard_1.pt"], 5)
        self.assertTrue(checkpoint.is_complete(path))
        with open(os.path.join(path, "pytorch_model", "shard_1.pt"), "w") as f:
            f.write("12")
        self.assertFalse(checkpoint.is_complete(path))

    def test_save_replaces_same_step_and_stale_tmp(self):
        accelerator, model, optimizer = self._accelerated(0)
        _make_step_dir(self.out, ".tmp-step-000003", complete=False)
        _make_step_dir(self.out, "step-000003")  # e.g. from a run that is being continued
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=3, losses=[1.0]))
        self.assertEqual(os.listdir(self.out), ["step-000003"])
        self.assertNotIn("weights.bin", os.listdir(path))
        with open(os.path.join(path, checkpoint.STATE_FILE)) as f:
            self.assertEqual(json.load(f)["losses"], [1.0])

    def test_load_restores_weights_optimizer_and_state(self):
        accelerator, model, optimizer = self._accelerated(0)
        self._train_one_step(model, optimizer)
        saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
        saved_moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
        state = TrainState(step=7, epoch=2, samples_in_epoch=40, samples_seen=96, losses=[3.0, 2.5, 2.25],
                           best_metric=0.75, best_step=6)
        path = checkpoint.save_checkpoint(accelerator, self.out, state)

        # Move everything away from the checkpoint, then come back.
        self._train_one_step(model, optimizer)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
        for key, value in model.state_dict().items():
            self.assertFalse(torch.equal(value, saved_weights[key]), key)
        self.assertFalse(torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_moments))
        restored = TrainState()

        checkpoint.load_checkpoint(accelerator, path, restored)

        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, saved_weights[key], rtol=0, atol=0)
        torch.testing.assert_close(optimizer.state_dict()["state"][0]["exp_avg"], saved_moments, rtol=0, atol=0)
        self.assertEqual((restored.step, restored.epoch, restored.samples_in_epoch, restored.samples_seen),
                         (7, 2, 40, 96))
        self.assertEqual(restored.losses, [3.0, 2.5, 2.25])
        self.assertEqual((restored.best_metric, restored.best_step), (0.75, 6))
        self.assertEqual(restored, state)

    def test_a_checkpoint_cannot_run_code(self):
        # An optimizer file that would run a command when unpickled: weights_only=True refuses it.
        accelerator, model, optimizer = self._accelerated(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1))
        marker = os.path.join(self.root, "pwned")

        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        torch.save({"state": Payload()}, os.path.join(path, "optimizer.bin"))
        with self.assertRaisesRegex(UsageError, r"checkpoint .*step-000001 could not be loaded .*damaged"):
            checkpoint.load_checkpoint(accelerator, path, TrainState())
        self.assertFalse(os.path.exists(marker))

    def test_a_checkpoint_of_another_model_is_named_so_not_damaged(self):
        accelerator, model, optimizer = self._accelerated(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1))
        loading = accelerate.Accelerator(cpu=True)  # a run of its own, whose one model has another last layer
        loading.prepare(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)))
        with self.assertRaises(UsageError) as raised:
            checkpoint.load_checkpoint(loading, path, TrainState())
        message = str(raised.exception)
        self.assertIn(f"checkpoint {path} holds another model than this run builds (size mismatch for 2.weight", message)
        self.assertTrue(message.endswith("resume with the flags that wrote it (--config_name, --peft and the like)"))
        self.assertNotIn("damaged", message)
        self.assertNotIn("\n", message)

    def test_a_v1_1_checkpoint_with_the_output_layer_tied_says_why(self):
        # Written when a fresh T5 v1.1 shared its output layer with the embedding (transformers 5's
        # own construction); the model built now has an output layer apart (modeling.untie_output_layer).
        from transformers import T5Config, T5ForConditionalGeneration

        from t5_training import modeling

        config = T5Config(vocab_size=32, d_model=8, d_ff=16, d_kv=4, num_heads=2, num_layers=1, num_decoder_layers=1,
                          relative_attention_num_buckets=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
        accelerator = accelerate.Accelerator(cpu=True)
        accelerator.prepare(T5ForConditionalGeneration(config))
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1))
        loading = accelerate.Accelerator(cpu=True)
        loading.prepare(modeling.fresh_model(config))
        with self.assertRaisesRegex(UsageError, r'holds another model than this run builds \(Missing key\(s\) in '
                                    r'state_dict: "lm_head.weight"\): it was written before this project gave T5 '
                                    r"v1.1's output layer weights of its own .*: finish that run with the version "
                                    r"that started it, or start afresh$"):
            checkpoint.load_checkpoint(loading, path, TrainState())

    def test_pickled_custom_objects_of_an_earlier_version_are_refused(self):
        accelerator, model, optimizer = self._accelerated(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1))
        torch.save({"last_epoch": 1}, os.path.join(path, "custom_checkpoint_0.pkl"))
        with self.assertRaisesRegex(UsageError, "pickled its scheduler .* not unpickled for safety"):
            checkpoint.load_checkpoint(accelerator, path, TrainState())

    def test_garbled_file_is_one_clear_error(self):
        accelerator, model, optimizer = self._accelerated(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1))
        target = os.path.join(path, "optimizer.bin")
        size = os.path.getsize(target)
        with open(target, "wb") as f:  # same size, so the manifest check passes: only loading can tell
            f.write(b"\0" * size)
        self.assertTrue(checkpoint.is_complete(path))
        with self.assertRaisesRegex(UsageError, "could not be loaded"):
            checkpoint.load_checkpoint(accelerator, path, TrainState())

    def test_load_into_fresh_model(self):
        accelerator, model, optimizer = self._accelerated(0)
        self._train_one_step(model, optimizer)
        saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1))

        other_accelerator, other_model, _ = self._accelerated(1)  # different initial weights
        self.assertFalse(torch.equal(other_model.state_dict()["0.weight"], saved_weights["0.weight"]))
        checkpoint.load_checkpoint(other_accelerator, path, TrainState())
        for key, value in other_model.state_dict().items():
            torch.testing.assert_close(value, saved_weights[key], rtol=0, atol=0)

    def test_scheduler_resumes_its_step(self):
        # As the loop does: the LambdaLR from optim is saved in train_state.json, not pickled.
        accelerator = accelerate.Accelerator(cpu=True)
        torch.manual_seed(0)
        config = TrainingConfig(output_dir=self.out, max_steps=10, learning_rate=0.1, warmup_steps=2)
        model = accelerator.prepare(torch.nn.Linear(4, 2))
        optimizer = accelerator.prepare(optim.build_optimizer(model, config))
        scheduler = optim.build_scheduler(optimizer, config, 10)
        for _ in range(4):
            self._train_one_step(model, optimizer)
            scheduler.step()
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=4), scheduler)
        self.assertEmpty([name for name in os.listdir(path) if name.startswith("custom_checkpoint")])
        for _ in range(3):
            self._train_one_step(model, optimizer)
            scheduler.step()
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.1 * (1 - 5 / 8), places=12)

        checkpoint.load_checkpoint(accelerator, path, TrainState(), scheduler)

        self.assertEqual(scheduler.last_epoch, 4)
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.1 * (1 - 2 / 8), places=12)
        self.assertAlmostEqual(scheduler.get_last_lr()[0], 0.1 * (1 - 2 / 8), places=12)
        scheduler.step()
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.1 * (1 - 3 / 8), places=12)

    def test_the_save_kill_point_comes_before_the_checkpoint_is_complete(self):
        # The resume tests crash a run there (T5_TRAINING_KILL_AT=save:S): the state is written, not yet marked.
        accelerator, _, _ = self._accelerated(0)
        seen = []

        def at_kill_point(site, step):
            seen.append((site, step, sorted(os.listdir(self.out)),
                         sorted(os.listdir(os.path.join(self.out, ".tmp-step-000005")))))

        with mock.patch.object(checkpoint, "kill_point", side_effect=at_kill_point):
            checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=5))
        self.assertLen(seen, 1)
        site, step, folders, written = seen[0]
        self.assertEqual((site, step, folders), ("save", 5, [".tmp-step-000005"]))
        self.assertIn("model.safetensors", written)
        self.assertNotIn(checkpoint.MANIFEST, written)

    def test_files_are_read_as_utf8_whatever_the_locale(self):
        # A manifest and a state file holding UTF-8 beyond ASCII (as another JSON writer leaves them).
        accelerator, _, _ = self._accelerated(0)
        state = TrainState(step=1, mixture={"files": ["données.jsonl"]})
        path = checkpoint.save_checkpoint(accelerator, self.out, state)
        with open(os.path.join(path, checkpoint.STATE_FILE), "w", encoding="utf-8") as f:
            json.dump(state.state_dict(), f, ensure_ascii=False)
        named = _make_step_dir(self.root, "step-000002")
        os.rename(os.path.join(named, "weights.bin"), os.path.join(named, "poids-é.bin"))
        with open(os.path.join(named, checkpoint.MANIFEST), "w", encoding="utf-8") as f:
            json.dump({"step": 2, "files": {"poids-é.bin": len("step-000002")}}, f, ensure_ascii=False)
        restored = TrainState()
        with fixtures.ascii_locale():
            self.assertTrue(checkpoint.is_complete(named))
            checkpoint.load_checkpoint(accelerator, path, restored)
        self.assertEqual(restored.mixture, {"files": ["données.jsonl"]})

    def test_the_refusal_of_pickled_objects_says_what_to_do(self):
        os.makedirs(self.out)
        open(os.path.join(self.out, "custom_checkpoint_0.pkl"), "w").close()
        with self.assertRaises(UsageError) as raised:
            checkpoint.load_checkpoint(None, self.out, TrainState())  # refused before anything is loaded
        self.assertEqual(str(raised.exception), (
            f"checkpoint {self.out} was written by an earlier version that pickled its scheduler "
            "(custom_checkpoint_*.pkl), which is not unpickled for safety; resume it with that version, or start over "
            "with --overwrite_output_dir"))

    @parameterized.named_parameters(
        ("first_line_only", RuntimeError("  storage is truncated\nat offset 40 "), "RuntimeError: storage is truncated"),
        ("no_message", EOFError(), "EOFError: EOFError"),
        ("long_message_cut", ValueError("x" * 300), "ValueError: " + "x" * 200))
    def test_a_load_failure_is_named_by_its_type_and_first_line(self, error, reason):
        os.makedirs(self.out)
        with mock.patch.object(checkpoint, "_load_state", side_effect=error):
            with self.assertRaises(UsageError) as raised:
                checkpoint.load_checkpoint(None, self.out, TrainState())
        self.assertEqual(str(raised.exception), f"checkpoint {self.out} could not be loaded ({reason}); it is damaged: "
                         "pass an earlier checkpoint, or 'auto' after deleting this one")
        self.assertIsNone(raised.exception.__cause__)


_Usage = collections.namedtuple("_Usage", "total used free")


class WriteFailureTest(_TmpDirTest):
    """A write that fails (a full disk, a read-only folder) ends in one WriteError and leaves nothing half-written."""

    def setUp(self):
        super().setUp()
        self.accelerator = accelerate.Accelerator(cpu=True)
        # 1.5 MiB free wherever asked: the message reports it to one decimal.
        patcher = mock.patch.object(checkpoint.shutil, "disk_usage", return_value=_Usage(0, 0, 3 * 2**19))
        self.disk_usage = patcher.start()
        self.addCleanup(patcher.stop)

    def _save_failing(self, step, error):
        def half_written(folder):  # the failure comes after part of the checkpoint is on disk
            os.makedirs(folder)
            open(os.path.join(folder, "model.safetensors"), "w").close()
            raise error

        with mock.patch.object(self.accelerator, "save_state", side_effect=half_written):
            return checkpoint.save_checkpoint(self.accelerator, self.out, TrainState(step=step))

    @parameterized.named_parameters(
        ("os_error", OSError(13, "Permission denied"), "Permission denied"),
        # The Rust writers (safetensors, tokenizers) raise plain exceptions that end in "(os error N)".
        ("rust_writer", Exception("failed to write tensor (os error 28)"), "No space left on device"),
        ("no_reason_given", OSError(), "OSError"))
    def test_a_failed_save_names_the_reason_the_space_and_the_intact_checkpoint(self, error, reason):
        os.makedirs(self.out)
        with self.assertRaises(WriteError) as raised:
            self._save_failing(2, error)
        target = os.path.join(self.out, "step-000002")
        self.assertEqual(str(raised.exception), f"could not write {target} ({reason}; 1.5 MiB free in {self.out}); no "
                         "earlier checkpoint exists, and nothing half-written was left: free space and rerun with "
                         "--resume_from_checkpoint auto")
        self.assertEqual(os.listdir(self.out), [])  # the .tmp- folder was removed
        for step in (1, 2):
            checkpoint.save_checkpoint(self.accelerator, self.out, TrainState(step=step))
        newest = checkpoint.save_checkpoint(self.accelerator, self.out, TrainState(step=3))
        with self.assertRaisesRegex(WriteError, f"could not write {self.out}/step-000004 .*; {newest} is intact"):
            self._save_failing(4, error)
        self.assertEqual(sorted(os.listdir(self.out)), ["step-000001", "step-000002", "step-000003"])

    def test_a_failure_writing_the_state_file_leaves_no_half_checkpoint(self):
        with mock.patch.object(checkpoint, "write_json", side_effect=OSError(28, "No space left on device")):
            with self.assertRaisesRegex(WriteError, f"^could not write {self.out}/step-000002 \\(No space left on "
                                                    f"device; 1.5 MiB free in {self.out}\\); no earlier checkpoint"):
                checkpoint.save_checkpoint(self.accelerator, self.out, TrainState(step=2))
        self.assertEqual(os.listdir(self.out), [])

    def test_an_error_that_is_not_a_write_failure_is_raised_as_it_is(self):
        with self.assertRaisesRegex(RuntimeError, "^a bug$"):
            self._save_failing(2, RuntimeError("a bug"))

    def test_a_failure_on_another_process_stops_this_one_too(self):
        # Two processes: this one wrote, the other failed; the all-reduce of the failure flags says so.
        partial = os.path.join(self.out, ".tmp-step-000002")
        os.makedirs(partial)
        accelerator = mock.Mock(num_processes=2, device="cpu", is_main_process=True)
        accelerator.reduce.side_effect = lambda flag, reduction: flag + 1
        with self.assertRaisesRegex(WriteError, r"^could not write \S+/step-000002 \(failed on another process; "):
            checkpoint.agree_on_write(accelerator, None, partial, os.path.join(self.out, "step-000002"), self.out)
        self.assertEqual(accelerator.reduce.call_args.kwargs, {"reduction": "sum"})
        self.assertFalse(os.path.exists(partial))
        # No process failed: nothing is raised or removed, and the all-reduce was the barrier.
        os.makedirs(partial)
        accelerator.reset_mock()
        accelerator.reduce.side_effect = lambda flag, reduction: flag
        checkpoint.agree_on_write(accelerator, None, partial, os.path.join(self.out, "step-000002"), self.out)
        self.assertTrue(os.path.isdir(partial))
        accelerator.wait_for_everyone.assert_not_called()

    def test_the_failure_flag_is_reduced_on_the_processes_device(self):
        # NCCL reduces CUDA tensors only: the flag is made on accelerator.device (the meta device stands in for a GPU).
        reduced = []

        def reduce(flag, reduction):
            reduced.append((flag.device, flag.shape))
            return torch.zeros(1)  # no process failed

        accelerator = mock.Mock(num_processes=2, device=torch.device("meta"), is_main_process=True)
        accelerator.reduce.side_effect = reduce
        checkpoint.agree_on_write(accelerator, None, os.path.join(self.out, ".tmp-step-000002"),
                                  os.path.join(self.out, "step-000002"), self.out)
        self.assertEqual(reduced, [(torch.device("meta"), (1,))])

    def test_a_target_in_a_missing_folder_has_no_free_space_to_report(self):
        missing = os.path.join(self.root, "gone")
        with self.assertRaises(WriteError) as raised:
            checkpoint.agree_on_write(self.accelerator, OSError(2, "No such file or directory"),
                                      os.path.join(missing, "best.tmp"), os.path.join(missing, "best"), missing)
        self.assertEqual(str(raised.exception), f"could not write {missing}/best (No such file or directory; 0.0 MiB "
                         f"free in {missing}); no earlier checkpoint exists, and nothing half-written was left: free "
                         "space and rerun with --resume_from_checkpoint auto")

    def test_the_free_space_is_that_of_the_targets_folder(self):
        os.makedirs(self.out)
        with self.assertRaisesRegex(WriteError, "1.5 MiB free in "):
            checkpoint.agree_on_write(self.accelerator, OSError(28, "No space left on device"),
                                      os.path.join(self.out, ".tmp-step-000002"), os.path.join(self.out, "step-000002"),
                                      self.out)
        self.disk_usage.assert_called_once_with(self.out)

    def test_only_the_main_process_finishes_a_checkpoint(self):
        # Every process saves its part (its RNG state); the main one alone writes the state and the manifest,
        # and renames the folder.
        accelerator = mock.Mock(num_processes=2, device="cpu", is_main_process=False,
                                distributed_type=DistributedType.MULTI_CPU)
        accelerator.save_state.side_effect = lambda folder: _make_step_dir(*os.path.split(folder), complete=False)
        accelerator.reduce.side_effect = lambda flag, reduction: flag
        os.makedirs(self.out)
        checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=2))
        self.assertEqual(fixtures.snapshot(self.out), {".tmp-step-000002/": None,
                                                       ".tmp-step-000002/weights.bin": b".tmp-step-000002"})

    def test_a_rust_writers_error_becomes_the_os_error_it_names(self):
        def write():
            raise Exception("failed to write tensor (os error 28)")

        error = checkpoint.attempt_write(write)
        self.assertIsInstance(error, OSError)
        self.assertEqual((error.errno, error.strerror), (28, os.strerror(28)))
        self.assertIsNone(checkpoint.attempt_write(lambda: None))


class TrainableOnlyTest(_TmpDirTest):
    """An adapter run's checkpoints hold its trainable weights alone, and load back into them."""

    def _model(self, seed, trainable=("2.weight", "2.bias")):
        accelerator = accelerate.Accelerator(cpu=True)
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        for name, param in model.named_parameters():
            param.requires_grad_(name in trainable)
        return accelerator, accelerator.prepare(model)

    def test_only_trainable_weights_are_saved_and_loaded(self):
        accelerator, model = self._model(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1), trainable_only=True)
        weights = load_file(os.path.join(path, "model.safetensors"))
        self.assertEqual(sorted(weights), ["2.bias", "2.weight"])
        torch.testing.assert_close(weights["2.weight"], model[2].weight, rtol=0, atol=0)

        other_accelerator, other = self._model(1)
        frozen = other[0].weight.clone()
        checkpoint.load_checkpoint(other_accelerator, path, TrainState(), trainable_only=True)
        torch.testing.assert_close(other[2].weight, model[2].weight, rtol=0, atol=0)
        torch.testing.assert_close(other[2].bias, model[2].bias, rtol=0, atol=0)
        torch.testing.assert_close(other[0].weight, frozen, rtol=0, atol=0)  # the starting model's, untouched
        # The hooks were removed: a whole checkpoint afterwards holds, and loads, every weight again.
        whole = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=2))
        self.assertLen(load_file(os.path.join(whole, "model.safetensors")), 4)
        checkpoint.load_checkpoint(other_accelerator, whole, TrainState())
        torch.testing.assert_close(other[0].weight, model[0].weight, rtol=0, atol=0)

    def test_each_models_weights_load_from_its_own_file(self):
        # accelerate writes the second prepared model's weights to model_1.safetensors.
        def two_models(seed):
            accelerator = accelerate.Accelerator(cpu=True)
            torch.manual_seed(seed)
            models = [torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
                      for _ in range(2)]
            for model in models:
                model[0].requires_grad_(False)
            return accelerator, accelerator.prepare(*models)

        accelerator, saved = two_models(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1), trainable_only=True)
        self.assertIn("model_1.safetensors", os.listdir(path))
        other_accelerator, loaded = two_models(1)
        checkpoint.load_checkpoint(other_accelerator, path, TrainState(), trainable_only=True)
        for want, got in zip(saved, loaded):
            torch.testing.assert_close(got[2].weight, want[2].weight, rtol=0, atol=0)
            torch.testing.assert_close(got[2].bias, want[2].bias, rtol=0, atol=0)

    def test_another_adapter_is_refused(self):
        accelerator, model = self._model(0)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1), trainable_only=True)
        other_accelerator, _ = self._model(1, trainable=("0.weight", "0.bias", "2.weight", "2.bias"))
        with self.assertRaises(UsageError) as raised:
            checkpoint.load_checkpoint(other_accelerator, path, TrainState(), trainable_only=True)
        self.assertEqual(str(raised.exception), (
            f"checkpoint {path} holds 2 adapter weights where this run's adapter trains 4, under other names: it was "
            "written with other --peft settings or for another model; resume it with those, or start a new run in "
            "another --output_dir"))

    def test_deepspeed_saves_and_loads_its_trainable_weights_itself(self):
        accelerator = mock.Mock(distributed_type=DistributedType.DEEPSPEED, num_processes=1, is_main_process=True)
        accelerator.save_state.side_effect = lambda folder, **kwargs: os.makedirs(folder)
        path = checkpoint.save_checkpoint(accelerator, self.out, TrainState(step=1), trainable_only=True)
        accelerator.save_state.assert_called_once_with(os.path.join(self.out, ".tmp-step-000001"),
                                                       exclude_frozen_parameters=True)
        checkpoint.load_checkpoint(accelerator, path, TrainState(), trainable_only=True)
        accelerator.load_state.assert_called_once_with(path, load_module_strict=False)
        accelerator.register_save_state_pre_hook.assert_not_called()


if __name__ == "__main__":
    absltest.main()
