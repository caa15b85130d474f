"""run_dir: saving into a run folder, and the one reader of it, on folders laid out as a run leaves them."""
import json
import os
import shutil
import tempfile
import types
from unittest import mock

import accelerate
import torch
import transformers
from absl.testing import absltest, parameterized
from safetensors.torch import load_file

import fine_tune_t5
import pre_train_t5
from t5_training import checkpoint, loop, mixture, reporting, run_dir, submission
from t5_training.config import TrainingConfig
from t5_training.errors import DivergedError, UsageError, WriteError
from tests import fixtures
from tests.simulated_gpu import gpu_host


def _write(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(value if isinstance(value, str) else json.dumps(value))


def _checkpoint(out, step, losses, complete=True, evals=True):
    path = checkpoint.checkpoint_dir(out, step)
    state = {"step": step, "losses": losses, **({"evals": [{"step": step, "accuracy": 50.0 + step}]} if evals else {})}
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

    def test_files_are_read_as_utf8_whatever_the_locale(self):
        # A results file holding UTF-8 beyond ASCII (as another JSON writer leaves it).
        _write(os.path.join(self.dir, "eval_results.json"), '{"task": "données", "accuracy": 81.0}')
        with fixtures.ascii_locale():
            self.assertEqual(run_dir.read_final_eval(self.dir), {"task": "données", "accuracy": 81.0})

    def test_a_state_without_evaluations_has_none(self):
        _checkpoint(self.dir, 2, [3.0], evals=None)  # from before "evals" was saved
        self.assertEqual(run_dir.read_losses(self.dir), [3.0])
        self.assertEqual(run_dir.read_evals(self.dir), [])

    def test_a_prompt_tuned_run_is_finished_with_its_adapter_alone(self):
        # Its final/ holds the adapter and no config.json (t5_training.adapters).
        _write(os.path.join(self.dir, "eval_results.json"), {"accuracy": 81.0})
        _write(os.path.join(self.dir, "train_results.json"), {"train_steps": 4})
        self.assertIsNone(run_dir.read_results(self.dir))
        _write(os.path.join(self.dir, "final", "adapter", "adapter_config.json"), {"peft_type": "PROMPT_TUNING"})
        self.assertEqual(run_dir.read_results(self.dir), {"train": {"train_steps": 4}, "eval": {"accuracy": 81.0}})


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

    def test_a_cpu_run_on_a_gpu_host_agrees_over_the_cpu(self):
        # Its processes' group is gloo: the flag they agree on stays on the CPU, not on the host's GPU
        # (which torch claims here and does not have, so touching it would raise).
        def all_reduce(flag, op):
            self.assertEqual(flag.device.type, "cpu")
            flag.zero_()  # another process found a non-finite weight

        with gpu_host(ACCELERATE_USE_CPU="1"), mock.patch("torch.distributed.is_initialized", return_value=True), \
                mock.patch("torch.distributed.get_world_size", return_value=2), \
                mock.patch("torch.distributed.all_reduce", side_effect=all_reduce) as reduced:
            with self.assertRaisesRegex(DivergedError, "not finite at here"):
                run_dir.ensure_finite_weights(torch.nn.Linear(2, 2), "here")
        reduced.assert_called_once()

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

    def test_the_scheduler_and_an_adapters_weights_are_what_is_saved(self):
        # An adapter run (--peft) checkpoints its trainable weights alone; the scheduler goes in as JSON.
        with tempfile.TemporaryDirectory() as out:
            accelerator = accelerate.Accelerator(cpu=True)
            model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)))
            model[0].requires_grad_(False)
            scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=1.0), lambda s: 1.0)
            for _ in range(3):
                scheduler.step()
            config = types.SimpleNamespace(output_dir=out, save_total_limit=0, peft="lora")
            path = run_dir.save(accelerator, config, model, scheduler, loop.TrainState(step=3))
            self.assertEqual(run_dir.read_state(out)["scheduler"]["last_epoch"], 3)
            self.assertEqual(sorted(load_file(os.path.join(path, "model.safetensors"))), ["1.bias", "1.weight"])


def _main_process(processes: int = 1, main: bool = True):
    # What write_results and write_eval_results ask of accelerate; `printed` collects the table.
    printed = []
    return types.SimpleNamespace(num_processes=processes, is_main_process=main, print=printed.append), printed


def _state(**values) -> loop.TrainState:
    # 2 steps of 16 rows: 7 rows into epoch 1; 2.50049 s of optimizer steps (rounding shows in every figure).
    values = {"step": 2, "epoch": 1, "samples_in_epoch": 7, "samples_seen": 16, "tokens_seen": 100,
              "train_seconds": 2.50049, "losses": [3.0, 1.5, 1.5], "best_metric": 60.0, "best_step": 2,
              "evals": [{"step": 1, "accuracy": 50.0}, {"step": 2, "accuracy": 60.0, "f1": 0.25},
                        {"step": 3, "accuracy": 55.0, "f1": 0.5}], **values}
    return loop.TrainState(**values)


class WriteResultsTest(fixtures.TempDirTestCase):
    """The results files a finished run leaves, on hand-computed figures."""

    def setUp(self):
        super().setUp()
        self.config = TrainingConfig(output_dir=self.dir, per_device_train_batch_size=4, gradient_accumulation_steps=2)
        # The plot is reporting's to test; here, what it is given (and matplotlib's import stays out of these tests).
        patcher = mock.patch.object(reporting, "save_loss_curves")
        self.plot = patcher.start()
        self.addCleanup(patcher.stop)

    def test_train_and_eval_results(self):
        accelerator, printed = _main_process()
        results = run_dir.write_results(accelerator, self.config, _state(), loop.Objective("accuracy"), per_epoch=6)
        train = {"train_loss": 2.0, "train_runtime": 2.5, "train_samples_per_second": 6.399,  # 16 / 2.50049
                 "train_tokens_per_second": 39.992, "train_steps": 2, "train_tokens": 100, "train_samples": 16,
                 "epoch": 1.2917}  # 1 + 7 rows of 6 micro-batches x 4 rows
        # The last evaluation's metrics (step 3), and the best (step 2's) as the state recorded it.
        evaluation = {"accuracy": 55.0, "f1": 0.5, "best_metric": 60.0, "best_step": 2, "metric_to_optimize": "accuracy"}
        self.assertEqual(results, {"train": train, "eval": evaluation})
        self.assertEqual(run_dir.read_final_eval(self.dir), evaluation)
        self.assertEqual(_read(self.dir, "train_results.json"), train)
        self.plot.assert_called_once_with(os.path.join(self.dir, "loss_curve.png"),
                                          {"training loss": {"train": [3.0, 1.5, 1.5]}})
        rows = [{"metric": "accuracy", "value": 55.0}, {"metric": "f1", "value": 0.5}]
        self.assertEqual(printed, [reporting.format_table(rows + [{"metric": k, "value": v} for k, v in train.items()])])

    def test_processes_count_in_the_epoch(self):
        accelerator, _ = _main_process(processes=2)
        results = run_dir.write_results(accelerator, self.config, _state(samples_in_epoch=12), loop.Objective("f1"),
                                        per_epoch=3)
        self.assertEqual(results["train"]["epoch"], 1.5)  # 12 rows of 3 micro-batches x 4 rows x 2 processes

    def test_a_run_with_no_steps_or_evaluations(self):
        accelerator, _ = _main_process()
        state = _state(losses=[], evals=[], train_seconds=0.0, best_metric=None, best_step=None)
        results = run_dir.write_results(accelerator, self.config, state, loop.Objective("accuracy"), per_epoch=0)
        train = results["train"]
        self.assertNotEqual(train["train_loss"], train["train_loss"])  # NaN: no loss to average
        self.assertIsNone(train["epoch"])  # a stream has no epoch length
        self.assertEqual(train["train_samples_per_second"], 16e9)  # divided by 1e-9 s, not by zero
        self.assertEqual(results["eval"], {"best_metric": None, "best_step": None, "metric_to_optimize": "accuracy"})
        self.plot.assert_not_called()  # no curve of no steps

    def test_only_the_main_process_writes(self):
        accelerator, printed = _main_process(main=False)
        results = run_dir.write_results(accelerator, self.config, _state(), loop.Objective("accuracy"), per_epoch=6)
        self.assertEqual(results["eval"]["accuracy"], 55.0)
        self.assertEqual(run_dir.write_eval_results(accelerator, self.dir, {"accuracy": 1.0}), {"accuracy": 1.0})
        self.assertEqual((os.listdir(self.dir), printed), ([], []))
        self.plot.assert_not_called()

    def test_eval_results_of_a_run_that_only_evaluates(self):
        accelerator, printed = _main_process()
        values = {"accuracy": 75.0, "eval_samples": 8}
        self.assertEqual(run_dir.write_eval_results(accelerator, self.dir, values), values)
        self.assertEqual(os.listdir(self.dir), ["eval_results.json"])
        self.assertEqual(run_dir.read_final_eval(self.dir), values)
        self.assertEqual(printed, [reporting.format_table([{"metric": "accuracy", "value": 75.0},
                                                           {"metric": "eval_samples", "value": 8}])])


def _read(folder, name):
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


class FiniteWeightsTest(absltest.TestCase):
    """ensure_finite_weights where the weights are sharded: ZeRO-3's own shard, and one decision for all processes."""

    def test_a_zero3_shard_is_checked_not_its_placeholder(self):
        model = torch.nn.Linear(2, 2)
        for param in model.parameters():
            param.ds_tensor = torch.ones(3)
        run_dir.ensure_finite_weights(model, "step 1")
        model.bias.ds_tensor = torch.tensor([1.0, float("nan")])
        with self.assertRaises(DivergedError) as raised:
            run_dir.ensure_finite_weights(model, "step 1")
        self.assertEqual(str(raised.exception), "the weights are not finite at step 1, so they were not saved; the last "
                         "saved checkpoint is intact. Lower --learning_rate, or use --mixed_precision bf16 over fp16")

    def test_on_gpus_the_flag_is_reduced_on_this_process_gpu(self):
        # NCCL reduces CUDA tensors only: the flag goes to this process's device (no GPU needed to check that).
        moved, to = [], torch.Tensor.to

        def record(tensor, **where):
            moved.append(where)
            return to(tensor, dtype=where["dtype"])

        with mock.patch.object(torch.distributed, "is_initialized", return_value=True), \
                mock.patch.object(torch.distributed, "get_world_size", return_value=2), \
                mock.patch.object(torch.distributed, "all_reduce") as reduce, \
                mock.patch.object(torch.cuda, "is_available", return_value=True), \
                mock.patch.object(torch.cuda, "current_device", return_value=3), \
                mock.patch.object(torch.Tensor, "to", record):
            run_dir.ensure_finite_weights(torch.nn.Linear(2, 2), "step 4")
        self.assertEqual(moved, [{"device": torch.device("cuda", 3), "dtype": torch.int32}])
        self.assertEqual(reduce.call_args.kwargs, {"op": torch.distributed.ReduceOp.MIN})
        self.assertEqual(reduce.call_args.args[0].tolist(), 1)

    def _on_two_processes(self, others_finite: bool, world_size: int = 2):
        # torch.distributed as two processes see it: all_reduce(MIN) brings in the other's flag.
        def all_reduce(flag, op):
            self.assertEqual((op, flag.dtype, flag.device.type), (torch.distributed.ReduceOp.MIN, torch.int32, "cpu"))
            flag.mul_(int(others_finite))

        reduce = mock.Mock(side_effect=all_reduce)
        with mock.patch.object(torch.distributed, "is_initialized", return_value=True), \
                mock.patch.object(torch.distributed, "get_world_size", return_value=world_size), \
                mock.patch.object(torch.distributed, "all_reduce", reduce), \
                mock.patch.object(torch.cuda, "is_available", return_value=False):
            run_dir.ensure_finite_weights(torch.nn.Linear(2, 2), "step 4")
        return reduce

    def test_a_process_with_finite_weights_stops_with_one_that_has_not(self):
        self.assertEqual(self._on_two_processes(others_finite=True).call_count, 1)
        with self.assertRaisesRegex(DivergedError, "not finite at step 4"):
            self._on_two_processes(others_finite=False)
        self._on_two_processes(others_finite=False, world_size=1).assert_not_called()  # one process: its own say


class ResumeIntoTest(fixtures.TempDirTestCase):
    """run_dir.resume: the checkpoint is loaded and checked before the folder is touched."""

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.dir, "out")
        self.accelerator = accelerate.Accelerator(cpu=True)
        self.config = TrainingConfig(output_dir=self.out, overwrite_output_dir=True, per_device_train_batch_size=4,
                                     gradient_accumulation_steps=2)
        # Saved on 2 processes of 4 rows x 1 micro-batch: the same global batch of 8 as this run's.
        self.saved = run_dir.save(self.accelerator, self.config, torch.nn.Linear(2, 2), None, loop.TrainState(
            step=3, samples_in_epoch=16, losses=[3.0, 2.0, 1.0], batch_layout={"per_device": 4, "accumulation": 1,
                                                                               "processes": 2}))
        _write(os.path.join(self.out, "train_results.json"), {"train_steps": 99})

    def test_resuming_loads_the_checkpoint_and_deletes_nothing(self):
        before, checked = fixtures.snapshot(self.out), []
        with mock.patch.object(self.accelerator, "print") as printed:
            state = run_dir.resume(self.accelerator, self.config, self.saved, loop.TrainState(), None,
                                   check=lambda state, path: checked.append((state.step, path)))
        printed.assert_called_once_with(f"resumed from {self.saved} at step 3")
        self.assertEqual((state.step, state.samples_in_epoch, state.losses), (3, 16, [3.0, 2.0, 1.0]))
        self.assertEqual(self.accelerator.step, 6)  # 3 steps x this run's 2 micro-batches
        self.assertEqual(checked, [(3, self.saved)])
        self.assertEqual(fixtures.snapshot(self.out), before)  # --overwrite_output_dir is not for a resumed run

    def test_an_adapter_run_resumes_its_weights_and_its_scheduler(self):
        model = self.accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)))
        model[0].requires_grad_(False)

        def scheduler():
            return torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=1.0), lambda s: 1.0)

        config = types.SimpleNamespace(output_dir=self.out, overwrite_output_dir=False, save_total_limit=0, peft="lora",
                                       per_device_train_batch_size=4, gradient_accumulation_steps=2)
        saved = scheduler()
        for _ in range(3):
            saved.step()
        # Its checkpoint holds the trainable weights alone: loading it whole would fail.
        path = run_dir.save(self.accelerator, config, model, saved, loop.TrainState(step=5))
        restored = scheduler()
        run_dir.resume(self.accelerator, config, path, loop.TrainState(), restored)
        self.assertEqual(restored.last_epoch, 3)

    def test_a_refused_checkpoint_leaves_no_trace(self):
        before = fixtures.snapshot(self.out)
        with self.assertRaisesRegex(UsageError, f"^checkpoint {self.saved} streamed its corpus over 2 processes, this "
                                                "run has 1"):
            run_dir.resume(self.accelerator, self.config, self.saved, loop.TrainState(), None, streaming=True)
        with self.assertRaisesRegex(UsageError, "the mixture changed"):
            run_dir.resume(self.accelerator, self.config, self.saved, loop.TrainState(), None,
                           check=mock.Mock(side_effect=UsageError("the mixture changed")))
        self.assertEqual(fixtures.snapshot(self.out), before)

    def test_starting_over_opens_the_folder_afresh(self):
        state, check = loop.TrainState(), mock.Mock()
        self.assertIs(run_dir.resume(self.accelerator, self.config, None, state, None, check=check), state)
        self.assertEqual((os.listdir(self.out), state.step), ([], 0))
        check.assert_not_called()


class ExportTest(fixtures.TempDirTestCase):

    def test_the_final_export_loads_and_non_finite_weights_are_never_exported(self):
        model = transformers.T5ForConditionalGeneration(fixtures.tiny_t5_config())
        tokenizer = mock.Mock()
        tokenizer.save_pretrained.side_effect = lambda folder: _write(os.path.join(folder, "tokenizer.json"), "{}")
        accelerator = accelerate.Accelerator(cpu=True)
        run_dir.export_final(accelerator, model, tokenizer, self.dir)
        self.assertEqual(sorted(os.listdir(self.dir)), ["final"])
        self.assertIn("tokenizer.json", os.listdir(os.path.join(self.dir, "final")))
        loaded = transformers.T5ForConditionalGeneration.from_pretrained(os.path.join(self.dir, "final"))
        self.assertTrue(torch.equal(loaded.shared.weight, model.shared.weight))
        before = fixtures.snapshot(self.dir)
        with torch.no_grad():
            model.shared.weight[0, 0] = float("nan")
        with self.assertRaisesRegex(DivergedError, "not finite at the end of training, so they were not saved"):
            run_dir.export_final(accelerator, model, tokenizer, self.dir)
        self.assertEqual(fixtures.snapshot(self.dir), before)


# Every kind of file an earlier run leaves at the top of its folder (checkpoints whole, half-saved
# and being saved; exports; results; predictions; GLUE's files; a mixture's record; a tensorboard
# log; files caught mid-write), and what is not a run's: it must survive --overwrite_output_dir.
LEFTOVERS = ["step-000002/", "step-000004/", ".tmp-step-000006/", "best/", "final/", "final.tmp/",
             "train_results.json", "eval_results.json", "eval_results.json.tmp", "loss_curve.png",
             "predictions_validation.tsv", "predictions_cola_validation.tsv", "predictions_test.tsv",
             "submission/", "submission.zip", "mixture_rows.tsv", "mixture_rates.json", "t5-fine-tune/"]
NOT_A_RUNS = ["notes.txt", "trial.log", "my_data/", "step-notes", "best_model.txt", "t5-fine-tune.tsv"]


def _leftovers(out):
    _checkpoint(out, 2, [3.0, 2.5])
    _checkpoint(out, 4, [3.0], complete=False)
    _write(os.path.join(out, ".tmp-step-000006", checkpoint.STATE_FILE), {"step": 6})
    for export in ("best", "final", "final.tmp"):
        _write(os.path.join(out, export, "config.json"), {"d_model": 16})
    _write(os.path.join(out, "final", "adapter", "adapter_config.json"), {"r": 8})
    _write(os.path.join(out, "train_results.json"), {"train_steps": 99})
    _write(os.path.join(out, "eval_results.json"), {"accuracy": 12.5, "best_step": 99})
    for name in LEFTOVERS[8:13]:
        _write(os.path.join(out, name), "old")
    _write(os.path.join(out, "submission", "STS-B.tsv"), "index\tprediction\n0\t2.5\n")
    _write(os.path.join(out, "submission", "CoLA.tsv"), "index\tprediction\n0\t1\n")
    for name in ("submission.zip", "mixture_rows.tsv", "mixture_rates.json"):
        _write(os.path.join(out, name), "old")
    # What tensorboard wrote, under whatever --project_name the earlier run had.
    _write(os.path.join(out, "t5-fine-tune", "events.out.tfevents.1700000000.host.1.0"), "old")
    _write(os.path.join(out, "t5-fine-tune", "1700000001.5", "events.out.tfevents.1700000001.host.1.1"), "old")
    _write(os.path.join(out, "t5-fine-tune", "1700000001.5", "hparams.yml"), "seed: 42\n")
    for name in NOT_A_RUNS:
        _write(os.path.join(out, name.rstrip("/"), "data.txt") if name.endswith("/") else
               os.path.join(out, name), "the user's")


def _listing(out):
    return sorted(name + "/" * os.path.isdir(os.path.join(out, name)) for name in os.listdir(out))


def _config(out, **flags):
    return fine_tune_t5.FineTuneConfig(output_dir=out, **flags)


class OverwriteTest(fixtures.TempDirTestCase):
    """--overwrite_output_dir: a run that starts over leaves its folder holding this run alone."""

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.dir, "out")
        _leftovers(self.out)
        self.assertEqual(_listing(self.out), sorted(LEFTOVERS + NOT_A_RUNS))

    def test_the_leftovers_are_named_as_the_modules_write_them(self):
        for name in (submission.SUBMISSION_DIR + "/", submission.ZIP_NAME, mixture.ROWS_FILE, mixture.RATES_FILE,
                     *run_dir.RESULTS_FILES.values(), run_dir.LOSS_CURVE, os.path.basename(
                         checkpoint.checkpoint_dir(self.out, 2)) + "/"):
            self.assertIn(name, LEFTOVERS)

    def test_a_missing_folder_is_created_empty(self):
        out = os.path.join(self.dir, "new", "run")
        run_dir.start_output_dir(accelerate.Accelerator(cpu=True), _config(out, overwrite_output_dir=True),
                                 resuming=False)
        self.assertEqual(os.listdir(out), [])

    def test_starting_over_deletes_every_file_an_earlier_run_wrote(self):
        kept = {name: value for name, value in fixtures.snapshot(self.out).items()
                if name.split("/")[0] + "/" * ("/" in name) in NOT_A_RUNS}
        config = _config(self.out, overwrite_output_dir=True)
        self.assertIsNone(run_dir.check_output_dir(config))
        run_dir.start_output_dir(accelerate.Accelerator(cpu=True), config, resuming=False)
        self.assertEqual(_listing(self.out), sorted(NOT_A_RUNS))
        self.assertEqual(fixtures.snapshot(self.out), kept)
        self.assertIsNone(run_dir.read_results(self.out))
        self.assertIsNone(run_dir.read_state(self.out))

    @parameterized.named_parameters(("without_the_flag", False, False), ("resuming", True, True))
    def test_deletes_nothing(self, overwrite, resuming):
        before = fixtures.snapshot(self.out)
        run_dir.start_output_dir(accelerate.Accelerator(cpu=True), _config(self.out, overwrite_output_dir=overwrite),
                                 resuming=resuming)
        self.assertEqual(fixtures.snapshot(self.out), before)

    def test_links_are_removed_and_never_followed(self):
        elsewhere = os.path.join(self.dir, "elsewhere")
        _write(os.path.join(elsewhere, "model", "config.json"), {"d_model": 16})
        _write(os.path.join(elsewhere, "STS-B.tsv"), "theirs")
        shutil.rmtree(os.path.join(self.out, "submission"))
        os.symlink(elsewhere, os.path.join(self.out, "submission"))
        os.symlink(os.path.join(elsewhere, "model"), os.path.join(self.out, "best", "linked_model"))
        before = fixtures.snapshot(elsewhere)
        run_dir.start_output_dir(accelerate.Accelerator(cpu=True), _config(self.out, overwrite_output_dir=True),
                                 resuming=False)
        self.assertEqual(_listing(self.out), sorted(NOT_A_RUNS))
        self.assertEqual(fixtures.snapshot(elsewhere), before)

    def test_each_file_of_a_list_flag_is_checked(self):
        # pretraining's --train_file takes several files: the second lies in what starting over deletes.
        inside = os.path.join(self.out, "mixture_rows.tsv")
        config = types.SimpleNamespace(output_dir=self.out, overwrite_output_dir=True, resume_from_checkpoint=None,
                                       train_file=[os.path.join(self.out, "notes.txt"), inside])
        with self.assertRaisesRegex(UsageError, f"^--train_file {inside} lies in {inside}, which"):
            run_dir.check_output_dir(config)

    def test_a_folder_that_cannot_be_created_is_one_clear_error(self):
        out = os.path.join(self.out, "notes.txt", "run")  # under a file: not even root can create it
        with self.assertRaises(WriteError) as raised:
            run_dir.start_output_dir(accelerate.Accelerator(cpu=True), _config(out), resuming=False)
        self.assertEqual(str(raised.exception), f"could not create or clear --output_dir {out} (Not a directory: "
                         f"{out}); fix its permissions, or choose another --output_dir")

    def test_a_link_to_a_tracker_folder_is_not_the_runs(self):
        # A link the user made, though what it points to holds only tensorboard files: never taken for the run's.
        logs = os.path.join(self.dir, "logs")
        _write(os.path.join(logs, "events.out.tfevents.1700000000.host.1.0"), "theirs")
        os.symlink(logs, os.path.join(self.out, "their-logs"))
        run_dir.start_output_dir(accelerate.Accelerator(cpu=True), _config(self.out, overwrite_output_dir=True),
                                 resuming=False)
        self.assertEqual(_listing(self.out), sorted(NOT_A_RUNS + ["their-logs/"]))

    def test_a_tracker_folder_holding_other_files_is_not_the_runs(self):
        _write(os.path.join(self.out, "t5-fine-tune", "plan.md"), "the user's")
        run_dir.start_output_dir(accelerate.Accelerator(cpu=True), _config(self.out, overwrite_output_dir=True),
                                 resuming=False)
        self.assertEqual(_listing(self.out), sorted(NOT_A_RUNS + ["t5-fine-tune/"]))

    @parameterized.named_parameters(
        ("model", "model_name_or_path", "final", "--model_name_or_path {out}/final lies in {out}/final"),
        ("tokenizer", "tokenizer_name", "best/", "--tokenizer_name {out}/best/ lies in {out}/best"),
        ("data", "validation_file", "predictions_validation.tsv",
         "--validation_file {out}/predictions_validation.tsv lies in {out}/predictions_validation.tsv"))
    def test_an_input_that_starting_over_would_delete_is_refused(self, flag, name, problem):
        before = fixtures.snapshot(self.out)
        flags = {flag: os.path.join(self.out, name)}
        if flag == "validation_file":
            flags["train_file"] = os.path.join(self.out, "notes.txt")
        with self.assertRaises(UsageError) as raised:
            run_dir.check_output_dir(_config(self.out, overwrite_output_dir=True, **flags))
        self.assertEqual(str(raised.exception), problem.format(out=self.out) +
                         f", which --overwrite_output_dir deletes before this run starts: copy it out of "
                         f"--output_dir {self.out} first, or choose another --output_dir")
        self.assertEqual(fixtures.snapshot(self.out), before)
        # Resuming deletes nothing, so it may read from the folder.
        resumed = _config(self.out, overwrite_output_dir=True, resume_from_checkpoint="auto", **flags)
        self.assertEqual(run_dir.check_output_dir(resumed), checkpoint.checkpoint_dir(self.out, 2))


class OverwriteRunTest(fixtures.TempDirTestCase):
    """Both scripts, started over in the folder of an earlier run, leave only their own run there."""

    @parameterized.named_parameters(("fine_tune", "fine_tune"), ("pre_train", "pre_train"))
    def test_a_run_started_over_leaves_only_itself(self, script):
        out = os.path.join(self.dir, "out")
        _leftovers(out)
        if script == "fine_tune":
            fine_tune_t5.main(fixtures.fine_tune_args(out, "--max_steps", "2", "--max_eval_samples", "8",
                                                      "--overwrite_output_dir"))
            predictions = ["predictions_validation.tsv"]
        else:
            pre_train_t5.main(["--config_name", fixtures.TINY_CONFIG, "--tokenizer_name", fixtures.tokenizer_dir(),
                               "--train_file", *fixtures.corpus_files(), "--output_dir", out, "--max_seq_length",
                               "32", "--max_steps", "2", "--max_eval_samples", "4", "--overwrite_output_dir"])
            predictions = []
        written = ["best/", "eval_results.json", "final/", "loss_curve.png", "step-000002/", "train_results.json"]
        self.assertEqual(_listing(out), sorted(written + predictions + NOT_A_RUNS))
        self.assertEqual(run_dir.read_results(out)["train"]["train_steps"], 2)
        self.assertEqual([os.path.basename(p) for p in checkpoint.list_checkpoints(out)], ["step-000002"])


if __name__ == "__main__":
    absltest.main()
