"""The shared loop: exact resume, accumulation that equals a bigger batch, schedule lengths.

Runs go through fine_tune_t5.main on a tiny T5 and 100 real SST-2 rows, so they exercise the
same code a user runs. With 100 rows and batch 8 an epoch has 13 micro-batches, so windows of
2 micro-batches straddle epoch boundaries, the case where off-by-one bugs live.
"""
import contextlib
import io
import math
import os
import tempfile
from unittest import mock

import torch
from torch._dynamo.utils import counters as dynamo_counters  # what torch.compile has compiled
from absl.testing import absltest, parameterized
from safetensors.torch import load_file
from torch.optim.optimizer import register_optimizer_step_pre_hook

import fine_tune_t5
from t5_training import adafactor, foreach, loop, losses, run_dir, step
from t5_training import optim as optim_module
from t5_training.config import TrainingConfig
from t5_training.errors import DivergedError, UsageError, run_cli
from tests import fixtures


def _run(output_dir, *extra):
    return fine_tune_t5.main(fixtures.fine_tune_args(output_dir, *extra))


def _losses(output_dir):
    return run_dir.read_losses(output_dir)


def _weights(output_dir):
    return load_file(os.path.join(output_dir, "final", "model.safetensors"))


class ResumeTest(parameterized.TestCase):
    @parameterized.named_parameters(
        # Dropout is on (the tiny config's 0.1), so the RNG state must be restored too.
        ("accumulation_2", "2"),
        ("accumulation_1", "1"),
    )
    def test_n_steps_then_resume_equals_2n_uninterrupted(self, accumulation):
        n = 8
        common = ["--gradient_accumulation_steps", accumulation, "--lr_scheduler_type", "constant_with_warmup",
                  "--warmup_steps", "3", "--eval_steps", str(n), "--save_steps", str(n)]
        with tempfile.TemporaryDirectory() as straight, tempfile.TemporaryDirectory() as split, \
                fixtures.deterministic_kernels():
            _run(straight, "--max_steps", str(2 * n), *common)
            _run(split, "--max_steps", str(n), *common)
            _run(split, "--max_steps", str(2 * n), "--resume_from_checkpoint", "auto", *common)

            straight_losses, split_losses = _losses(straight), _losses(split)
            self.assertLen(straight_losses, 2 * n)
            self.assertEqual(straight_losses, split_losses)  # exact, not approximate
            a, b = _weights(straight), _weights(split)
            self.assertEqual(a.keys(), b.keys())
            for name in a:
                self.assertTrue(torch.equal(a[name], b[name]), name)

    def test_resume_from_finished_run_trains_no_more(self):
        with tempfile.TemporaryDirectory() as out:
            _run(out, "--max_steps", "3")
            result = _run(out, "--max_steps", "3", "--resume_from_checkpoint", "auto")
            self.assertEqual(result["train"]["train_steps"], 3)
            self.assertLen(_losses(out), 3)


@contextlib.contextmanager
def _gradients_at_each_step():
    """Yields a list that gets, at every optimizer step, that step's learning rate and a copy of its gradients."""
    steps = []

    def record(optimizer, args, kwargs):
        grads = [p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        steps.append((optimizer.param_groups[0]["lr"], grads))

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield steps
    finally:
        handle.remove()


class AccumulationTest(absltest.TestCase):
    def test_accumulating_two_batches_of_8_equals_one_batch_of_16(self):
        # What accumulation must get right is the gradient each optimizer step sees, so that is
        # what is compared, at every step. Not the weights after Adam: Adam moves each weight by
        # about lr whatever the size of its gradient, so a gradient that is rounding noise (the
        # two runs pad and sum in different orders, and another CPU picks other kernels) moves
        # its weight by +-lr at random, and later gradients inherit the difference. A learning
        # rate of 1e-12 moves no weight by more than a few 1e-12, below float32 resolution of the
        # weights, so both runs take every step's gradient at the same weights, and the only
        # difference left is summation order. Clipping is off: clipping to norm 1, like Adam
        # itself, hides a gradient scaled by a constant (a lost accumulation factor).
        # Without dropout both runs compute the same function of the same 16 rows per step.
        # (Every SST-2 target is 2 tokens, so a mean per micro-batch would equal the window's
        # token mean here: this test cannot tell them apart.)
        common = ["--max_steps", "6", "--dropout_rate", "0", "--lr_scheduler_type", "linear", "--warmup_steps", "2",
                  "--learning_rate", "1e-12", "--max_grad_norm", "0"]
        with tempfile.TemporaryDirectory() as accumulated, tempfile.TemporaryDirectory() as big:
            with _gradients_at_each_step() as a_steps:
                _run(accumulated, "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2", *common)
            with _gradients_at_each_step() as b_steps:
                _run(big, "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1", *common)
            a_losses, b_losses = _losses(accumulated), _losses(big)
        # One optimizer step per window of two micro-batches, on the same schedule.
        self.assertEqual((len(a_steps), len(b_steps)), (6, 6))
        self.assertEqual([lr for lr, _ in a_steps], [lr for lr, _ in b_steps])
        self.assertLen(a_losses, 6)
        for i, (a, b) in enumerate(zip(a_losses, b_losses), start=1):
            self.assertAlmostEqual(a, b, delta=fixtures.same_computation(1e-5) * abs(b), msg=f"step {i}")
        for i, ((_, a_grads), (_, b_grads)) in enumerate(zip(a_steps, b_steps), start=1):
            self.assertEqual(len(a_grads), len(b_grads))
            for j, (a, b) in enumerate(zip(a_grads, b_grads)):
                # Float32 sums of a step's ~1,000 token terms differ by order 1e-6 of the terms
                # (4e-7 measured here), and an element whose terms cancel carries the error of
                # its terms, not of its small value: so the bound is relative to the tensor's
                # largest gradient, element by element. Miscounting one of a step's 32 target
                # tokens would shift every gradient by 3%, a dropped micro-batch or a lost
                # accumulation factor by tens of percent.
                torch.testing.assert_close(a, b, rtol=0, atol=fixtures.same_gradient(1e-4) * b.abs().max().item(),
                                           msg=lambda m: f"step {i}, parameter {j} {tuple(b.shape)}: {m}")


class EarlyStoppingTest(absltest.TestCase):
    def test_stops_after_patience_evaluations_without_improvement(self):
        # A learning rate this small cannot change a greedy prediction, so the metric is flat:
        # step 1 sets the best, steps 2 and 3 fail to improve, and patience 2 stops at step 3.
        with tempfile.TemporaryDirectory() as out:
            result = _run(out, "--max_steps", "50", "--learning_rate", "1e-12", "--eval_steps", "1",
                          "--early_stopping_patience", "2")
            self.assertEqual(result["train"]["train_steps"], 3)
            self.assertEqual(result["eval"]["best_step"], 1)
            self.assertLen(_losses(out), 3)


class EvaluationLeavesTrainingAloneTest(parameterized.TestCase):
    """Evaluating, and exporting best/ at each better evaluation, must not change what training does.

    Both draw from the RNG that dropout draws from (a DataLoader iterator takes its seed from it; an
    adapter's export builds a model copy whose initial weights come from it), so without
    loop.evaluate_and_track's fork a run's losses depended on --eval_steps.
    """

    @parameterized.named_parameters(("full", ()),
                                    ("lora", ("--peft", "lora", "--lora_target_modules", "q,k,v,o,wi,wo")))
    def test_a_run_trains_the_same_however_often_it_evaluates(self, adapter):
        with tempfile.TemporaryDirectory() as often, tempfile.TemporaryDirectory() as once:
            flags = ["--max_steps", "6", "--dropout_rate", "0.1", *adapter]
            fine_tune_t5.main(fixtures.fine_tune_args(often, *flags, "--eval_steps", "2"))  # at 2, 4, 6
            fine_tune_t5.main(fixtures.fine_tune_args(once, *flags, "--eval_steps", "6"))  # at the end only
            self.assertLen(run_dir.read_evals(often), 3)
            self.assertLen(run_dir.read_losses(once), 6)
            self.assertEqual(run_dir.read_losses(often), run_dir.read_losses(once))


class ObjectiveTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("first_value", True, 1.0, None, True),
        ("higher_is_better", True, 2.0, 1.0, True),
        ("equal_is_no_improvement", True, 1.0, 1.0, False),
        ("lower_is_better", False, 0.5, 1.0, True),
        ("nan_never_improves", True, float("nan"), None, False),
    )
    def test_improved(self, greater, value, best, expected):
        self.assertEqual(loop.Objective("m", greater).improved(value, best), expected)



class NonFiniteGuardTest(absltest.TestCase):

    def test_non_finite_steps_are_skipped_and_training_goes_on(self):
        with tempfile.TemporaryDirectory() as out, fixtures.nan_on_steps({3, 4}, accumulation=2):
            _run(out, "--max_steps", "6", "--save_steps", "1", "--save_total_limit", "0",
                 "--gradient_accumulation_steps", "2", "--max_nonfinite_steps", "3")
            losses = _losses(out)
            self.assertEqual([math.isnan(x) for x in losses], [False, False, True, True, False, False])
            # Skipped steps leave the weights (and optimizer) exactly as they were.
            weights = [load_file(os.path.join(out, f"step-{s:06d}", "model.safetensors")) for s in (2, 4, 5)]
            for name in weights[0]:
                self.assertTrue(torch.equal(weights[0][name], weights[1][name]), name)
            self.assertFalse(all(torch.equal(weights[1][n], weights[2][n]) for n in weights[1]))
            self.assertTrue(all(torch.isfinite(t).all() for t in _weights(out).values()))

    def test_too_many_in_a_row_stops_with_the_likely_cause_and_exit_code_3(self):
        with tempfile.TemporaryDirectory() as out, fixtures.nan_on_steps(set(range(3, 100))):
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                code = run_cli(fine_tune_t5.main, fixtures.fine_tune_args(
                    out, "--max_steps", "10", "--save_steps", "1", "--max_nonfinite_steps", "3"))
            self.assertEqual(code, 3)
            lines = [line for line in stderr.getvalue().splitlines() if line.startswith("diverged:")]
            self.assertLen(lines, 1, stderr.getvalue()[-2000:])
            self.assertIn("not finite for 3 steps in a row (up to step 5)", lines[0])
            self.assertIn("lower --learning_rate (now 0.001)", lines[0])
            # Steps 3 and 4 were skipped, so their checkpoints hold the finite weights of step 2;
            # nothing was saved at or after the step that stopped the run.
            saved = sorted(n for n in os.listdir(out) if n.startswith("step-"))
            self.assertEqual(saved[-1], "step-000004")
            self.assertFalse(os.path.exists(os.path.join(out, "final")))

    def test_fp16_is_named_as_the_cause_under_fp16(self):
        accelerator = mock.Mock(mixed_precision="fp16")
        state = loop.TrainState(step=7, nonfinite_in_a_row=1)
        with self.assertRaisesRegex(DivergedError, "fp16.*--mixed_precision bf16"):
            step.guard_nonfinite(accelerator, TrainingConfig(max_nonfinite_steps=2), state, 7, applied=False)

    def test_zero_never_stops(self):
        state = loop.TrainState(step=70, nonfinite_in_a_row=50)
        step.guard_nonfinite(mock.Mock(mixed_precision="no"), TrainingConfig(max_nonfinite_steps=0), state, 70,
                              applied=False)
        self.assertEqual(state.nonfinite_in_a_row, 51)
        step.guard_nonfinite(mock.Mock(), TrainingConfig(), state, 71, applied=True)
        self.assertEqual(state.nonfinite_in_a_row, 0)


class HostSyncTest(parameterized.TestCase):
    # Fine-tuning's default optimizer (fused AdamW), pretraining's (T5's Adafactor), and nanoT5's.
    @parameterized.parameters("adamw_torch", "adafactor", "adamw_scale")
    def test_no_host_read_between_logging_steps(self, optim):
        # Every way a tensor's value reaches Python is recorded when the loop's own code asks
        # for it; the steps (and the loop around them) must ask for none. (transformers' T5
        # reads its attention mask once per forward to decide whether SDPA needs it; that read
        # is the model's, not the loop's.)
        import sys
        reads = []

        def recording(name):
            real = getattr(torch.Tensor, name)

            def read(self, *args, **kwargs):
                caller = sys._getframe(1).f_code
                if caller.co_filename in (loop.__file__, step.__file__, losses.__file__):
                    reads.append(caller.co_name)
                return real(self, *args, **kwargs)
            return mock.patch.object(torch.Tensor, name, read)

        with tempfile.TemporaryDirectory() as out, contextlib.ExitStack() as stack:
            for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
                stack.enter_context(recording(name))
            # And the reads torch makes itself, as where a tensor is given for a Python number.
            torch_reads = stack.enter_context(fixtures.host_reads())
            _run(out, "--max_steps", "8", "--logging_steps", "4", "--gradient_accumulation_steps", "2",
                 "--optim", optim)
        per_step = {"train_step", "window_counts", "train", "_micro_batches", "forward_loss_sum",
                    "token_cross_entropy_sum", "add", "maybe_log", "due"}
        self.assertFalse(per_step & set(reads), sorted(set(reads)))
        optimizers = {os.path.basename(m.__file__) for m in (foreach, adafactor, optim_module)}
        self.assertEqual([(file, function) for file, function in torch_reads
                          if function in per_step or file in optimizers], [])
        # Two logging steps, each reading the losses and the counts once.
        self.assertEqual(reads.count("flush"), 4, reads)

    @parameterized.parameters("adamw_torch", "adafactor", "adamw_scale")
    def test_no_cuda_sync_inside_a_step_but_the_models_own(self, optim):
        # On a GPU, what the test above checks by name, CUDA itself checks: every synchronizing
        # call made inside a step warns. The model's own read of its attention mask (transformers'
        # masking utilities decide there whether SDPA may skip the mask) is the one allowed.
        if not torch.cuda.is_available():
            self.skipTest("needs a GPU: T5_TRAINING_TEST_DEVICE=cuda (tools/gpu_check.sh runs it)")
        import warnings

        import transformers
        syncs, calls = [], []

        def checked(real):  # real(...) with CUDA warning at every synchronizing call, the warnings kept
            def run(*args, **kwargs):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        result = real(*args, **kwargs)
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
                # CUDA's own words for a sync: torch's one-time notice that the mode is a prototype
                # ("... does not yet detect all synchronizing operations") is no sync.
                syncs.extend(w for w in caught if "called a synchronizing CUDA operation" in str(w.message))
                calls.append(real.__name__)
                return result
            return run

        with tempfile.TemporaryDirectory() as out, \
                mock.patch.object(loop, "train_step", checked(loop.train_step)), \
                mock.patch.object(loop, "window_counts", checked(loop.window_counts)):
            _run(out, "--max_steps", "4", "--logging_steps", "4", "--gradient_accumulation_steps", "2",
                 "--optim", optim)
        self.assertEqual(sorted(calls), ["train_step"] * 4 + ["window_counts"] * 4)
        checked(lambda: torch.ones(1, device="cuda").item())()  # a read: the check sees it
        self.assertTrue(syncs and syncs[-1].filename == __file__, [str(w.message) for w in syncs])
        syncs.pop()
        model_code = os.path.dirname(transformers.__file__)
        self.assertEqual([f"{w.filename}:{w.lineno}: {w.message}" for w in syncs
                          if not w.filename.startswith(model_code)], [])


class TorchCompileTest(absltest.TestCase):
    def test_compiled_run_matches_eager(self):
        # aot_eager traces and differentiates the graph as inductor does, without the C++
        # compile time; inductor itself runs in benchmarks/.
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            common = ["--max_steps", "3", "--save_steps", "3", "--dropout_rate", "0"]
            dynamo_counters.clear()
            _run(a, *common)
            self.assertEqual(dynamo_counters["stats"]["unique_graphs"], 0)
            fixtures.reset_accelerate_state()  # as a new process: accelerate keeps the first run's settings
            _run(b, *common, "--torch_compile", "--torch_compile_backend", "aot_eager")
            # It compiled: the model's forward became graphs (none when accelerate ignores the flag).
            self.assertGreater(dynamo_counters["stats"]["unique_graphs"], 0)
            for x, y in zip(_losses(a), _losses(b)):
                self.assertAlmostEqual(x, y, delta=fixtures.same_computation(1e-4) * abs(x))
            self.assertEqual(_weights(a).keys(), _weights(b).keys())  # saved without a compile wrapper's prefix

    def test_fine_tuning_on_a_gpu_compiles_once_per_padded_width_and_never_after(self):
        # On a GPU, batches are padded to a few widths (batching.compiled_widths), each compiled
        # to a static graph once; run here on the CPU with the GPU's padding. 16 steps of 8 out of
        # 100 rows cross an epoch's end.
        with tempfile.TemporaryDirectory() as out, fixtures.graphs_per_step() as steps, \
                mock.patch("t5_training.batching.runs_on_cuda", return_value=True):
            _run(out, "--max_steps", "16", "--max_eval_samples", "8", "--group_by_length",
                 "--torch_compile", "--torch_compile_backend", "aot_eager")
        fixtures.assert_compiled_once_per_shape(self, steps)
        widths = {dict(shapes)["input_ids"][1] for shapes, _ in steps}
        self.assertLessEqual(widths, {8, 16, 32, 64})  # compile_widths(--max_source_length 64)
        self.assertGreater(len(widths), 1)  # so that the test sees a change of shape
        self.assertEqual({dict(shapes)["labels"][1] for shapes, _ in steps}, {8})

    def test_fine_tuning_on_a_cpu_compiles_one_graph_for_every_length(self):
        # On a CPU batches keep their longest row's width, compiled once for symbolic lengths
        # (ACCELERATE_USE_CPU: a CPU run even where the CUDA subset shows the tests a GPU).
        with tempfile.TemporaryDirectory() as out, fixtures.graphs_per_step() as steps, \
                mock.patch.dict(os.environ, {"ACCELERATE_USE_CPU": "1"}):
            _run(out, "--max_steps", "16", "--max_eval_samples", "8", "--group_by_length",
                 "--torch_compile", "--torch_compile_backend", "aot_eager")
        fixtures.assert_compiled_once_per_shape(self, steps)
        self.assertGreater(len({shapes for shapes, _ in steps}), 4)
        self.assertEqual(sum(graphs for _, graphs in steps), steps[0][1])  # all at the first step

    def test_unknown_backend_is_one_line(self):
        with tempfile.TemporaryDirectory() as out:
            with self.assertRaisesRegex(UsageError, "--torch_compile_backend 'nope' is not"):
                _run(out, "--max_steps", "1", "--torch_compile", "--torch_compile_backend", "nope")


if __name__ == "__main__":
    absltest.main()
