"""step.train_step on a tiny T5: the gradient it applies is that of the window's token mean, clipped as asked.

AdamW and Adafactor are invariant to a constant gradient scale, and clipping at norm 1 hides one
too, so a lost factor in the step's scale would not show in a training run's losses. These tests
read the gradient the optimizer is handed and compare it with one computed by plain autograd.
"""
import contextlib
import copy
import math
import types
from unittest import mock

import torch
from absl.testing import absltest, parameterized
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
import transformers

from t5_training import losses, step
from t5_training.adafactor import T5Adafactor
from t5_training.optim import AdamWScale
from t5_training.errors import DivergedError
from tests import fixtures


class _RecordingSGD(torch.optim.SGD):
    """SGD at lr 0 that keeps a copy of the gradients it is asked to apply."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.applied = []

    def step(self, closure=None):
        self.applied.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def _micro_batch(generator, rows, source_len, target_lens):
    """A batch as the collator makes it: padded inputs and labels (-100 past each row's target)."""
    input_ids = torch.randint(2, 32, (rows, source_len), generator=generator)
    attention_mask = torch.ones(rows, source_len, dtype=torch.long)
    attention_mask[0, source_len // 2:] = 0  # one padded input row
    labels = torch.randint(2, 32, (rows, max(target_lens)), generator=generator)
    for row, length in enumerate(target_lens):
        labels[row, length:] = -100
    decoder_input_ids = torch.cat([torch.zeros(rows, 1, dtype=torch.long), labels[:, :-1].clamp(min=0)], dim=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "decoder_input_ids": decoder_input_ids}


def _window():
    # Micro-batches with 5, 9 and 3 target tokens: the token mean over the window is not the
    # mean of the micro-batches' means, so weighting by tokens matters as well as the scale.
    generator = torch.Generator().manual_seed(0)
    return [_micro_batch(generator, 2, 6, (2, 3)), _micro_batch(generator, 3, 5, (4, 4, 1)),
            _micro_batch(generator, 1, 7, (3,))]


class TrainStepGradientTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        torch.manual_seed(0)
        # No dropout: the reference pass below must compute the same function.
        self.model = transformers.T5ForConditionalGeneration(fixtures.tiny_t5_config(dropout_rate=0.0))
        self.window = _window()
        # The reference: d(summed loss / target tokens)/dW over the whole window, by plain autograd.
        reference = copy.deepcopy(self.model)
        tokens = sum(int((b["labels"] != -100).sum()) for b in self.window)
        self.assertEqual(tokens, 17)
        (sum(losses.forward_loss_sum(reference, b) for b in self.window) / tokens).backward()
        self.expected = [p.grad.detach().clone() for p in reference.parameters()]
        self.expected_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                                   for g in self.expected])).item()

    def _applied_gradient(self, max_grad_norm, processes=1):
        """The gradient train_step hands the optimizer for the window, accumulated over its 3 micro-batches."""
        accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=len(self.window), sync_with_dataloader=False, adjust_scheduler=False))
        model, optimizer = accelerator.prepare(self.model, _RecordingSGD(self.model.parameters()))
        # On a GPU the accelerator's device is not torch's default one: made a device that cannot
        # compute (meta), the default must be where no tensor of the step is made.
        with torch.device("meta"):
            counts = step.window_counts(accelerator, self.window, stop_requested=False)
            with mock.patch.object(Accelerator, "num_processes", new_callable=mock.PropertyMock,
                                   return_value=processes):
                loss = step.train_step(accelerator, model, optimizer, self.window, counts, max_grad_norm, step=1)
        self.assertEqual(counts.tolist()[:2], [17.0, 6.0])  # target tokens, samples
        self.assertTrue(torch.isfinite(loss))
        self.assertLen(optimizer.optimizer.applied, 1)  # one optimizer step for the whole window
        return optimizer.optimizer.applied[0]

    def _norm(self, grads):
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()

    @parameterized.named_parameters(("zero", 0.0), ("far_above_the_norm", 1e6))
    def test_unclipped_gradient_is_that_of_the_window_token_mean(self, max_grad_norm):
        # accelerator.backward divides each micro-batch's loss by the 3 accumulation steps; the
        # step's scale multiplies that back. Were the factor lost, every gradient here would be a
        # third of the reference, which AdamW and Adafactor (scale invariant) would never show.
        applied = self._applied_gradient(max_grad_norm)
        self.assertGreater(self.expected_norm, 0.0)
        for got, want in zip(applied, self.expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
        self.assertAlmostEqual(self._norm(applied), self.expected_norm, delta=1e-4 * self.expected_norm)

    def test_the_scale_undoes_ddp_averaging_over_processes(self):
        # DDP averages the gradients of N processes, so each process scales its loss by N. Told of
        # 2 processes but averaged by none here, the applied gradient is exactly twice the reference.
        applied = self._applied_gradient(0.0, processes=2)
        for got, want in zip(applied, self.expected, strict=True):
            torch.testing.assert_close(got, 2 * want, rtol=1e-4, atol=1e-7)

    def test_gradient_above_max_grad_norm_is_clipped_to_it(self):
        # Clipped to half its norm: the same direction, every element halved, norm exactly the limit.
        limit = self.expected_norm / 2
        applied = self._applied_gradient(limit)
        self.assertAlmostEqual(self._norm(applied), limit, delta=1e-4 * limit)
        for got, want in zip(applied, self.expected, strict=True):
            torch.testing.assert_close(got, want / 2, rtol=1e-4, atol=1e-7)


def _bool_of_no_tensor(value):
    if isinstance(value, torch.Tensor):
        raise AssertionError("the step read a tensor's value on the host")
    return bool(value)


def _accelerator(window):
    return Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(
        num_steps=len(window), sync_with_dataloader=False, adjust_scheduler=False))


class TrainStepResultTest(parameterized.TestCase):
    """What a step returns and leaves behind, and the steps it must skip."""

    def setUp(self):
        super().setUp()
        torch.manual_seed(0)
        self.model = transformers.T5ForConditionalGeneration(fixtures.tiny_t5_config(dropout_rate=0.0))
        self.window = _window()
        with torch.no_grad():
            self.token_mean = (sum(losses.forward_loss_sum(self.model, b) for b in self.window) / 17).item()

    def _run(self, optimizer, poison=None, steps=1, host_reads=True):
        """train_step `steps` times on the window; `poison` makes one weight's gradient infinite in the first.

        With host_reads False, the step's turning a tensor into a Python bool (a GPU sync) fails it.
        """
        accelerator = _accelerator(self.window)
        model, optimizer = accelerator.prepare(self.model, optimizer)
        counts = step.window_counts(accelerator, self.window, stop_requested=False)
        hook = poison and model.lm_head.weight.register_hook(lambda grad: grad * math.inf)
        results = []
        for n in range(1, steps + 1):
            with (mock.patch.object(step, "kill_point") as kill_point,
                  mock.patch.object(accelerator, "no_sync", wraps=accelerator.no_sync) as no_sync,
                  mock.patch.object(step, "bool", _bool_of_no_tensor, create=True)
                  if not host_reads else contextlib.nullcontext()):
                results.append(step.train_step(accelerator, model, optimizer, self.window, counts, 1.0, step=n))
            self.assertEqual(kill_point.call_args_list, [mock.call("micro", n, m) for m in (1, 2, 3)])
            # Under DDP the model's no_sync keeps the first two micro-batches from all-reducing.
            self.assertEqual(no_sync.call_args_list, [mock.call(model)] * 2)
            if hook:
                hook.remove()
                hook = None
            # Gradients are freed after every step, applied or not: the next window starts from none.
            self.assertTrue(all(p.grad is None for p in model.parameters()))
        return results

    def test_returns_the_token_mean_loss_of_the_window_before_the_update(self):
        weights = [p.detach().clone() for p in self.model.parameters()]
        loss, = self._run(torch.optim.SGD(self.model.parameters(), lr=0.1))
        self.assertEqual(loss.dim(), 0)
        self.assertAlmostEqual(loss.item(), self.token_mean, places=5)
        self.assertTrue(any(not torch.equal(w, p) for w, p in zip(weights, self.model.parameters())))

    def test_window_counts_targets_samples_tokens_and_the_stop_request(self):
        accelerator = _accelerator(self.window)
        inputs = sum(int(b["attention_mask"].sum()) for b in self.window)
        self.assertEqual(step.window_counts(accelerator, self.window, stop_requested=False).tolist(),
                         [17.0, 6.0, inputs + 17.0, 0.0])
        self.assertEqual(step.window_counts(accelerator, self.window, stop_requested=True).tolist()[3], 1.0)

    def test_an_infinite_gradient_skips_an_optimizer_that_cannot_skip_itself(self):
        optimizer = _RecordingSGD(self.model.parameters())
        weights = [p.detach().clone() for p in self.model.parameters()]
        loss, = self._run(optimizer, poison=True)
        self.assertTrue(math.isnan(loss.item()))  # the loss was finite; the step is reported as skipped
        self.assertEqual(optimizer.applied, [])  # never handed the gradients
        for before, after in zip(weights, self.model.parameters()):
            self.assertTrue(torch.equal(before, after))

    def test_under_fp16_an_infinite_gradient_is_left_to_the_grad_scaler(self):
        # accelerate's GradScaler must see the overflowing step to lower its scale, and skips it itself.
        # The GradScaler accelerate makes for fp16 on a GPU (the process's accelerator state, set
        # by the first test, stays fp32: the scaler unscales the gradients in its own step).
        accelerator = _accelerator(self.window)
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        model, optimizer = accelerator.prepare(self.model, _RecordingSGD(self.model.parameters()))
        model.lm_head.weight.register_hook(lambda grad: grad * math.inf)
        counts = step.window_counts(accelerator, self.window, stop_requested=False)
        loss = step.train_step(accelerator, model, optimizer, self.window, counts, 1.0, step=1)
        self.assertAlmostEqual(loss.item(), self.token_mean, places=5)  # finite: the scaler's to skip
        self.assertEqual(optimizer.optimizer.applied, [])
        self.assertEqual(accelerator.scaler.get_scale(), 512.0)

    def test_a_missing_gradient_norm_counts_as_finite(self):
        # Older accelerate returns no norm under DeepSpeed, whose engine has already judged the step.
        optimizer = _RecordingSGD(self.model.parameters())
        with mock.patch.object(Accelerator, "clip_grad_norm_", return_value=None):
            loss, = self._run(optimizer)
        self.assertAlmostEqual(loss.item(), self.token_mean, places=5)
        self.assertLen(optimizer.applied, 1)

    def test_a_fused_adamw_accelerate_did_not_wrap_skips_on_the_device_too(self):
        accelerator = _accelerator(self.window)
        model = accelerator.prepare(self.model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        weights = [p.detach().clone() for p in model.parameters()]
        model.lm_head.weight.register_hook(lambda grad: grad * math.inf)
        counts = step.window_counts(accelerator, self.window, stop_requested=False)
        with mock.patch.object(step, "bool", _bool_of_no_tensor, create=True):
            loss = step.train_step(accelerator, model, optimizer, self.window, counts, 1.0, step=1)
        self.assertTrue(math.isnan(loss.item()))
        self.assertTrue(all(torch.equal(w, p) for w, p in zip(weights, model.parameters())))
        self.assertTrue(all(p.grad is None for p in model.parameters()))  # freed, not zeroed

    def test_an_infinite_gradient_skips_unfused_adamw_before_it_steps(self):
        # Only fused Adam(W) reads `found_inf`: the unfused one would apply the infinite gradient.
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2, fused=False)
        weights = [p.detach().clone() for p in self.model.parameters()]
        loss, = self._run(optimizer, poison=True)
        self.assertTrue(math.isnan(loss.item()))
        self.assertEmpty(optimizer.state)  # never stepped
        for before, after in zip(weights, self.model.parameters()):
            self.assertTrue(torch.equal(before, after))

    @parameterized.named_parameters(
        ("fused_adamw", lambda params: torch.optim.AdamW(params, lr=1e-2, fused=True)),  # fine-tuning's default
        ("t5_adafactor", lambda params: T5Adafactor(params, lr=1e-2)),  # pretraining's
        ("adamw_scale", lambda params: AdamWScale(params, lr=1e-2)))  # nanoT5's
    def test_skips_on_the_device_and_steps_again_after(self, factory):
        optimizer = factory(self.model.parameters())
        weights = [p.detach().clone() for p in self.model.parameters()]
        # The verdict never leaves the device: no step waits for the host.
        skipped, applied = self._run(optimizer, poison=True, steps=2, host_reads=False)
        self.assertTrue(math.isnan(skipped.item()))
        self.assertAlmostEqual(applied.item(), self.token_mean, places=5)  # the weights were not moved
        # Only the second step counted: the first left weights, moments and step count as they were.
        for state in optimizer.state.values():
            self.assertEqual(state["step"].item(), 1.0)
        moved = [not torch.equal(w, p) for w, p in zip(weights, self.model.parameters())]
        self.assertTrue(all(moved), "every weight has a gradient and each optimizer moves it")


class GuardNonfiniteTest(parameterized.TestCase):

    def _guard(self, applied_steps, limit=3, mixed_precision="no", learning_rate=1e-3):
        printed = []
        accelerator = types.SimpleNamespace(print=printed.append, mixed_precision=mixed_precision)
        config = types.SimpleNamespace(max_nonfinite_steps=limit, resolved_learning_rate=learning_rate)
        state = types.SimpleNamespace(nonfinite_in_a_row=0)
        for n, applied in enumerate(applied_steps, start=1):
            step.guard_nonfinite(accelerator, config, state, n, applied)
        return state, printed

    def test_counts_skipped_steps_in_a_row_and_an_applied_step_resets_the_count(self):
        state, printed = self._guard([False, False, True, False])
        self.assertEqual(state.nonfinite_in_a_row, 1)
        self.assertEqual(printed, [f"step {n}: non-finite loss or gradients; step skipped, weights unchanged"
                                   for n in (1, 2, 4)])

    @parameterized.named_parameters(
        ("fp32", "no", r"the learning rate is likely too high for this model and batch: lower --learning_rate "
                       r"\(now 0.003\) or raise --warmup_steps"),
        ("fp16", "fp16", r"T5 overflows in fp16 .*use --mixed_precision bf16"))
    def test_the_limit_stops_the_run_naming_the_likely_cause(self, mixed_precision, cause):
        self._guard([False, False], mixed_precision=mixed_precision, learning_rate=3e-3)  # under the limit
        with self.assertRaisesRegex(DivergedError, r"^the loss was not finite for 3 steps in a row \(up to step 4\); "
                                                   + cause + r"\. Checkpoints saved before that are intact$"):
            self._guard([True, False, False, False], mixed_precision=mixed_precision, learning_rate=3e-3)

    def test_limit_zero_never_stops(self):
        state, _ = self._guard([False] * 20, limit=0)
        self.assertEqual(state.nonfinite_in_a_row, 20)


if __name__ == "__main__":
    absltest.main()
