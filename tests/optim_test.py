"""Tests for t5_training.optim: schedule values worked out by hand, and the optimizers it builds."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import torch
import transformers
from accelerate.utils import DummyOptim
from transformers.optimization import Adafactor

from t5_training import optim
from t5_training.adafactor import T5Adafactor
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError


def _tiny_t5():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1)
    return transformers.T5ForConditionalGeneration(config)


def _config(**overrides):
    return TrainingConfig(output_dir="unused", max_steps=50, **overrides)


class LrMultiplierTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # Linear: warmup (step + 1) / (warmup + 1), then down to 0 at `total`.
        ("linear_warmup_first", "linear", 0, 4, 14, 1 / 5),
        ("linear_warmup_mid", "linear", 1, 4, 14, 2 / 5),
        ("linear_warmup_last", "linear", 3, 4, 14, 4 / 5),
        ("linear_peak", "linear", 4, 4, 14, 1.0),
        ("linear_decay_quarter", "linear", 6, 4, 12, 0.75),
        ("linear_decay_half", "linear", 9, 4, 14, 0.5),
        ("linear_end", "linear", 14, 4, 14, 0.0),
        ("linear_past_end", "linear", 20, 4, 14, 0.0),
        ("linear_no_warmup_start", "linear", 0, 0, 10, 1.0),
        ("linear_no_warmup_mid", "linear", 3, 0, 10, 0.7),
        # One decay step: progress is (step - warmup) / (total - warmup), down to 0 at `total`.
        ("linear_one_decay_step", "linear", 5, 4, 5, 0.0),
        # Cosine: 0.5 * (1 + cos(pi * progress)), flat at 0 after `total`.
        ("cosine_start", "cosine", 0, 0, 100, 1.0),
        ("cosine_quarter", "cosine", 25, 0, 100, 0.5 * (1 + math.sqrt(0.5))),
        ("cosine_half", "cosine", 50, 0, 100, 0.5),
        ("cosine_half_after_warmup", "cosine", 60, 10, 110, 0.5),
        ("cosine_warmup", "cosine", 4, 9, 100, 0.5),
        ("cosine_end", "cosine", 100, 0, 100, 0.0),
        ("cosine_past_end", "cosine", 150, 0, 100, 0.0),
        # Constant ignores warmup entirely.
        ("constant_start", "constant", 0, 0, 10, 1.0),
        ("constant_with_unused_warmup", "constant", 2, 10, 100, 1.0),
        ("constant_end", "constant", 10, 0, 10, 1.0),
        # Constant with warmup: the linear ramp, then flat at the peak (also past `total`).
        ("constant_with_warmup_first", "constant_with_warmup", 0, 3, 10, 0.25),
        ("constant_with_warmup_last", "constant_with_warmup", 2, 3, 10, 0.75),
        ("constant_with_warmup_peak", "constant_with_warmup", 3, 3, 10, 1.0),
        ("constant_with_warmup_late", "constant_with_warmup", 50, 3, 10, 1.0),
        # Inverse square root: sqrt(warmup / max(step, warmup)), flat at the peak during warmup.
        ("inverse_sqrt_step0", "inverse_sqrt", 0, 100, 1000, 1.0),
        ("inverse_sqrt_in_warmup", "inverse_sqrt", 50, 100, 1000, 1.0),
        ("inverse_sqrt_at_warmup", "inverse_sqrt", 100, 100, 1000, 1.0),
        ("inverse_sqrt_4x", "inverse_sqrt", 400, 100, 1000, 0.5),
        ("inverse_sqrt_9x", "inverse_sqrt", 900, 100, 1000, 1 / 3),
        ("inverse_sqrt_past_total", "inverse_sqrt", 10000, 100, 1000, 0.1),
        ("inverse_sqrt_no_warmup", "inverse_sqrt", 4, 0, 10, 0.5),
        ("inverse_sqrt_no_warmup_step0", "inverse_sqrt", 0, 0, 10, 1.0),
    )
    def test_golden_values(self, kind, step, warmup, total, expected):
        self.assertAlmostEqual(optim.lr_multiplier(kind, step, warmup, total), expected, places=12)

    def test_unknown_schedule_raises(self):
        with self.assertRaisesRegex(ValueError, "polynomial"):
            optim.lr_multiplier("polynomial", 5, 0, 10)


class WarmupStepsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("ratio", 0, 0.1, 50, 5),
        ("ratio_rounds_up", 0, 0.1, 45, 5),
        ("ratio_float_noise_0_07", 0, 0.07, 100, 7),
        ("ratio_float_noise_0_14", 0, 0.14, 50, 7),
        # Rounded to 6 decimals: a product within 5e-7 of a whole step is that step.
        ("ratio_within_a_millionth", 0, 0.070000004, 100, 7),
        ("steps_win_over_ratio", 3, 0.5, 50, 3),
        ("steps_alone", 8, 0.0, 50, 8),
        ("neither", 0, 0.0, 50, 0),
    )
    def test_warmup_steps(self, steps, ratio, total, expected):
        config = _config(warmup_steps=steps, warmup_ratio=ratio)
        self.assertEqual(optim.warmup_steps(config, total), expected)


class BuildSchedulerTest(parameterized.TestCase):

    def _lrs(self, config, total, n):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = optim.build_optimizer(model, config)
        scheduler = optim.build_scheduler(optimizer, config, total)
        lrs = []
        for _ in range(n):
            lrs.append(optimizer.param_groups[0]["lr"])
            self.assertEqual(optimizer.param_groups[1]["lr"], lrs[-1])
            optimizer.step()
            scheduler.step()
        return lrs

    @parameterized.named_parameters(
        ("linear", "linear"),
        ("cosine", "cosine"),
        ("constant", "constant"),
        ("constant_with_warmup", "constant_with_warmup"),
        ("inverse_sqrt", "inverse_sqrt"),
    )
    def test_lr_is_learning_rate_times_multiplier(self, kind):
        config = _config(learning_rate=0.01, lr_scheduler_type=kind, warmup_steps=4)
        lrs = self._lrs(config, total=12, n=14)
        for step, lr in enumerate(lrs):
            self.assertAlmostEqual(lr, 0.01 * optim.lr_multiplier(kind, step, 4, 12), places=15)

    def test_linear_values_by_hand(self):
        config = _config(learning_rate=0.01, lr_scheduler_type="linear", warmup_steps=4)
        lrs = self._lrs(config, total=8, n=9)
        expected = [0.002, 0.004, 0.006, 0.008, 0.01, 0.0075, 0.005, 0.0025, 0.0]
        for lr, want in zip(lrs, expected):
            self.assertAlmostEqual(lr, want, places=15)

    def test_warmup_steps_win_over_ratio(self):
        config = _config(learning_rate=1.0, lr_scheduler_type="constant_with_warmup", warmup_steps=2,
                         warmup_ratio=0.5)
        lrs = self._lrs(config, total=50, n=4)
        self.assertSequenceAlmostEqual(lrs, [1 / 3, 2 / 3, 1.0, 1.0], places=15)

    def test_warmup_ratio_of_total(self):
        # 0.1 of 50 steps: 5 warmup steps, so the peak is first reached at step 5.
        config = _config(learning_rate=1.0, lr_scheduler_type="constant_with_warmup", warmup_ratio=0.1)
        lrs = self._lrs(config, total=50, n=7)
        self.assertSequenceAlmostEqual(lrs, [1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0, 1.0], places=15)


class AdamWScaleTest(parameterized.TestCase):
    def test_first_step_is_lr_times_rms_in_the_gradient_sign(self):
        # Step 1 of Adam moves every weight by lr * m/sqrt(v) = lr * sign(g) (bias-corrected,
        # eps aside); AdamWScale multiplies that by the tensor's RMS before the step.
        weights = torch.tensor([3.0, -4.0, 0.0, 5.0])  # RMS = sqrt((9 + 16 + 0 + 25) / 4) = sqrt(12.5)
        param = torch.nn.Parameter(weights.clone())
        param.grad = torch.tensor([0.5, -2.0, 1.0, -0.1])
        optimizer = optim.AdamWScale([param], lr=0.1, eps=1e-12)
        optimizer.step()
        expected = weights - 0.1 * math.sqrt(12.5) * torch.sign(param.grad)
        torch.testing.assert_close(param.data, expected)

    def test_rms_is_floored_for_tensors_near_zero(self):
        param = torch.nn.Parameter(torch.zeros(3))
        param.grad = torch.tensor([1.0, -1.0, 2.0])
        optim.AdamWScale([param], lr=0.5, eps=1e-12).step()
        torch.testing.assert_close(param.data, torch.tensor([-5e-4, 5e-4, -5e-4]))

    def test_decoupled_weight_decay_is_not_scaled(self):
        param = torch.nn.Parameter(torch.full((4,), 2.0))
        param.grad = torch.zeros(4)
        optim.AdamWScale([param], lr=0.1, weight_decay=0.5, eps=1e-12).step()
        torch.testing.assert_close(param.data, torch.full((4,), 2.0 * (1 - 0.1 * 0.5)))

    def test_steps_match_adam_with_bias_correction_rms_scale_and_decay(self):
        # Three steps worked out in float64 from the update rule: the moments' bias correction
        # changes with the step count, the RMS is the weights' before the step, decay comes first.
        lr, (beta1, beta2), eps, decay = 0.05, (0.8, 0.9), 1e-6, 0.1
        weights = [0.5, -1.5, 2.0]
        grads = [[0.3, -0.2, 0.1], [-0.5, 0.4, 0.2], [0.1, 0.1, -0.3]]
        param = torch.nn.Parameter(torch.tensor(weights))
        optimizer = optim.AdamWScale([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay)
        m, v = [0.0] * 3, [0.0] * 3
        for t, grad in enumerate(grads, start=1):
            param.grad = torch.tensor(grad)
            optimizer.step()
            rms = max(math.sqrt(sum(w * w for w in weights) / 3), 1e-3)
            m = [beta1 * a + (1 - beta1) * g for a, g in zip(m, grad)]
            v = [beta2 * b + (1 - beta2) * g * g for b, g in zip(v, grad)]
            weights = [w * (1 - lr * decay) - lr / (1 - beta1 ** t) * a / (math.sqrt(b / (1 - beta2 ** t)) + eps) * rms
                       for w, a, b in zip(weights, m, v)]
            torch.testing.assert_close(param.data, torch.tensor(weights), msg=f"step {t}")
        self.assertEqual(optimizer.state[param]["step"], 3)

    def test_a_parameter_without_gradient_is_skipped_not_the_rest(self):
        idle, moved = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
        moved.grad = torch.tensor([1.0, -1.0])
        optimizer = optim.AdamWScale([idle, moved], lr=0.1, eps=1e-12)
        optimizer.step()
        torch.testing.assert_close(idle.data, torch.ones(2))
        torch.testing.assert_close(moved.data, torch.tensor([0.9, 1.1]))
        self.assertNotIn(idle, optimizer.state)

    def test_step_runs_the_closure_with_gradients_and_returns_its_loss(self):
        # torch.optim's contract: the closure recomputes the loss and its gradients, so it runs with grad enabled.
        param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
        optimizer = optim.AdamWScale([param], lr=0.1, eps=1e-12)

        def closure():
            optimizer.zero_grad()
            loss = (param ** 2).sum()
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        self.assertAlmostEqual(loss.item(), 5.0, places=6)
        rms = math.sqrt(2.5)  # first step: lr * rms * sign(grad)
        torch.testing.assert_close(param.data, torch.tensor([1.0 - 0.1 * rms, -2.0 + 0.1 * rms]))
        param.grad = torch.ones(2)
        self.assertIsNone(optimizer.step())  # no closure, no loss

    def test_defaults_are_adams(self):
        optimizer = optim.AdamWScale([torch.nn.Parameter(torch.ones(2))])
        self.assertEqual(optimizer.defaults, {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                                              "foreach": None})

    def test_selected_by_optim_flag(self):
        model = torch.nn.Linear(4, 4)
        optimizer = optim.build_optimizer(model, TrainingConfig(optim="adamw_scale", learning_rate=0.02))
        self.assertIsInstance(optimizer, optim.AdamWScale)
        self.assertEqual(optimizer.defaults["lr"], 0.02)


class BuildOptimizerTest(parameterized.TestCase):

    def test_adamw_by_default_with_config_hyperparameters(self):
        config = _config(learning_rate=0.123, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6,
                         weight_decay=0.01)
        optimizer = optim.build_optimizer(torch.nn.Linear(3, 2), config)
        self.assertIs(type(optimizer), torch.optim.AdamW)
        for group in optimizer.param_groups:
            self.assertEqual(group["lr"], 0.123)
            self.assertEqual(group["betas"], (0.8, 0.95))
            self.assertEqual(group["eps"], 1e-6)

    def test_weight_decay_only_on_matrices(self):
        model = _tiny_t5()
        optimizer = optim.build_optimizer(model, _config(weight_decay=0.05))
        names = {id(p): n for n, p in model.named_parameters()}
        decay = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.05 for p in g["params"]}
        no_decay = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
        self.assertLen(optimizer.param_groups, 2)
        # Every trainable parameter is optimized exactly once.
        self.assertEqual(sorted(decay | no_decay), sorted(names.values()))
        self.assertEmpty(decay & no_decay)
        self.assertEqual(sum(len(g["params"]) for g in optimizer.param_groups), len(names))
        self.assertEqual(no_decay, {
            "encoder.block.0.layer.0.layer_norm.weight", "encoder.block.0.layer.1.layer_norm.weight",
            "encoder.final_layer_norm.weight", "decoder.block.0.layer.0.layer_norm.weight",
            "decoder.block.0.layer.1.layer_norm.weight", "decoder.block.0.layer.2.layer_norm.weight",
            "decoder.final_layer_norm.weight",
        })
        self.assertIn("shared.weight", decay)
        self.assertIn("encoder.block.0.layer.0.SelfAttention.q.weight", decay)
        self.assertIn("decoder.block.0.layer.2.DenseReluDense.wo.weight", decay)
        for name, param in model.named_parameters():
            self.assertEqual(name in decay, param.ndim == 2, name)

    def test_biases_are_not_decayed(self):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
        optimizer = optim.build_optimizer(model, _config(weight_decay=0.1))
        decay_group, no_decay_group = optimizer.param_groups
        self.assertEqual(decay_group["weight_decay"], 0.1)
        self.assertEqual(no_decay_group["weight_decay"], 0.0)
        self.assertEqual([p.shape for p in decay_group["params"]], [(4, 3), (2, 4)])
        self.assertEqual([p.shape for p in no_decay_group["params"]], [(4,), (4,), (4,), (2,)])

    def test_layer_norms_are_not_decayed_whatever_their_shape(self):
        # The rule is by name as well as by shape: a 2-D weight named layer_norm is a scale, not a matrix to decay.
        model = torch.nn.ModuleDict({"dense": torch.nn.Linear(3, 3, bias=False),
                                     "layer_norm": torch.nn.Linear(3, 3, bias=False)})
        decay_group, no_decay_group = optim.build_optimizer(model, _config(weight_decay=0.1)).param_groups
        self.assertEqual(decay_group["params"], [model["dense"].weight])
        self.assertEqual(no_decay_group["params"], [model["layer_norm"].weight])

    def test_adamw_scale_gets_the_flags_betas_and_eps(self):
        config = _config(optim="adamw_scale", adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6)
        optimizer = optim.build_optimizer(torch.nn.Linear(3, 2), config)
        self.assertEqual([(g["betas"], g["eps"]) for g in optimizer.param_groups], [((0.8, 0.95), 1e-6)] * 2)

    def test_adamw_is_fused_unless_deepspeed_drives_it(self):
        # Fused on CPU (and CUDA); under DeepSpeed, ZeRO drives the client optimizer, which stays unfused.
        self.assertIs(optim.build_optimizer(torch.nn.Linear(3, 2), _config()).defaults["fused"], True)
        ds_config = {"zero_optimization": {"stage": 2}}
        self.assertIs(optim.build_optimizer(torch.nn.Linear(3, 2), _config(), ds_config).defaults["fused"], False)

    def test_frozen_parameters_are_left_out(self):
        model = torch.nn.Linear(3, 2)
        model.bias.requires_grad_(False)
        optimizer = optim.build_optimizer(model, _config())
        self.assertEqual([len(g["params"]) for g in optimizer.param_groups], [1, 0])
        self.assertIs(optimizer.param_groups[0]["params"][0], model.weight)

    def test_decay_actually_shrinks_weights_only(self):
        # With zero gradients AdamW's update is pure decay: w <- w * (1 - lr * wd).
        model = torch.nn.Linear(3, 2)
        weight, bias = model.weight.detach().clone(), model.bias.detach().clone()
        optimizer = optim.build_optimizer(model, _config(learning_rate=0.1, weight_decay=0.5))
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        torch.testing.assert_close(model.weight.detach(), weight * (1 - 0.1 * 0.5))
        torch.testing.assert_close(model.bias.detach(), bias)

    def test_adafactor_is_t5s(self):
        model = _tiny_t5()
        optimizer = optim.build_optimizer(model, _config(optim="adafactor", learning_rate=1e-3))
        self.assertIsInstance(optimizer, T5Adafactor)
        self.assertEqual(optimizer.defaults["lr"], 1e-3)
        self.assertIs(optimizer.defaults["multiply_by_parameter_scale"], True)
        self.assertEqual(optimizer.defaults["min_dim_size_to_factor"], 128)
        self.assertEqual(optimizer.defaults["eps"], (1e-30, 1e-3))
        self.assertEqual([g["lr"] for g in optimizer.param_groups], [1e-3, 1e-3])

    def test_adafactor_hf_is_the_external_lr_variant(self):
        model = _tiny_t5()
        optimizer = optim.build_optimizer(model, _config(optim="adafactor_hf", learning_rate=1e-3, weight_decay=0.01))
        self.assertIsInstance(optimizer, Adafactor)
        self.assertEqual(optimizer.defaults["lr"], 1e-3)
        self.assertIs(optimizer.defaults["scale_parameter"], False)
        self.assertIs(optimizer.defaults["relative_step"], False)
        self.assertIs(optimizer.defaults["warmup_init"], False)
        self.assertEqual([g["weight_decay"] for g in optimizer.param_groups], [0.01, 0.0])

    @parameterized.named_parameters(
        # T5 fine-tunes with Adafactor at a constant 1e-3; AdamW keeps HF's 3e-4 linear default.
        ("adafactor", "adafactor", 1e-3, "constant"),
        ("adafactor_hf", "adafactor_hf", 1e-3, "constant"),
        ("adamw", "adamw_torch", 3e-4, "linear"),
        ("adamw_scale", "adamw_scale", 3e-4, "linear"),
    )
    def test_unset_learning_rate_and_schedule_follow_the_optimizer(self, name, lr, schedule):
        config = _config(optim=name)
        self.assertEqual((config.resolved_learning_rate, config.resolved_lr_scheduler_type), (lr, schedule))
        self.assertEqual((config.learning_rate, config.lr_scheduler_type), (None, None))  # unset stays unset
        given = _config(optim=name, learning_rate=5e-4, lr_scheduler_type="cosine")
        self.assertEqual((given.resolved_learning_rate, given.resolved_lr_scheduler_type), (5e-4, "cosine"))
        self.assertEqual((given.learning_rate, given.lr_scheduler_type), (5e-4, "cosine"))

    def test_adafactor_follows_scheduler(self):
        model = torch.nn.Linear(3, 2)
        config = _config(optim="adafactor", learning_rate=0.01, lr_scheduler_type="linear", warmup_steps=1)
        optimizer = optim.build_optimizer(model, config)
        scheduler = optim.build_scheduler(optimizer, config, 3)
        lrs = []
        for _ in range(4):
            lrs.append(optimizer.param_groups[0]["lr"])
            model(torch.ones(1, 3)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        self.assertSequenceAlmostEqual(lrs, [0.005, 0.01, 0.005, 0.0], places=15)


def _ds_config(**optimizer_params):
    """A DeepSpeed config whose "optimizer" block has these params (ZeRO-Offload's shape)."""
    params = {"lr": "auto", "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": "auto", **optimizer_params}
    return {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            "optimizer": {"type": "AdamW", "params": params}}


class DeepSpeedOptimizerTest(parameterized.TestCase):

    @parameterized.parameters("adamw_torch", "adafactor", "adamw_scale", "adafactor_hf")
    def test_without_an_optimizer_block_the_flag_runs_as_zeros_client_optimizer(self, name):
        ds_config = {"zero_optimization": {"stage": 2}}
        optimizer = optim.build_optimizer(torch.nn.Linear(3, 2), _config(optim=name), ds_config)
        self.assertIsInstance(optimizer, torch.optim.Optimizer)

    def test_an_optimizer_block_gets_a_dummy_with_the_flags_lr_and_weight_groups(self):
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
        optimizer = optim.build_optimizer(model, _config(learning_rate=2e-4, weight_decay=0.1), _ds_config())
        self.assertIsInstance(optimizer, DummyOptim)
        self.assertEqual((optimizer.lr, optimizer.weight_decay), (2e-4, 0.1))
        self.assertEqual([g["weight_decay"] for g in optimizer.params], [0.1, 0.0])
        self.assertEqual([len(g["params"]) for g in optimizer.params], [1, 3])

    @parameterized.named_parameters(
        ("scheduler_block", {}, {"scheduler": {"type": "WarmupLR", "params": {}}}, "scheduler.*--lr_scheduler_type"),
        ("other_optim_flag", {"optim": "adafactor"}, {}, "--optim adafactor cannot run.*--optim adamw_torch"),
        ("other_type", {}, {"optimizer": {"type": "Lamb", "params": {}}}, '"Lamb"; use "type": "AdamW"'),
        ("betas", {"adam_beta2": 0.98}, {},
         r'"betas": \[0.9, 0.999\] but --adam_beta1 --adam_beta2 gives \[0.9, 0.98\]'),
        ("betas_auto", {}, {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}}},
         '"betas": "auto"'),
        ("eps", {"adam_epsilon": 1e-6}, {}, '"eps": 1e-08 but --adam_epsilon gives 1e-06'),
        ("lr_number", {"learning_rate": 1e-4}, {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}},
         '"lr": 0.0003 but --learning_rate gives 0.0001'),
        # Left out, lr takes DeepSpeed's default, which must not silently replace the flag.
        ("lr_missing", {"learning_rate": 1e-4}, {"optimizer": {"type": "AdamW", "params": {}}}, '"lr": 0.001'),
    )
    def test_refused_with_one_line_naming_the_fix(self, flags, ds_overrides, message):
        with self.assertRaisesRegex(UsageError, message) as raised:
            optim.build_optimizer(torch.nn.Linear(3, 2), _config(**flags), {**_ds_config(), **ds_overrides})
        self.assertNotIn("\n", str(raised.exception))

    @parameterized.named_parameters(
        ("scheduler_block", {}, {"scheduler": {"type": "WarmupLR", "params": {}}},
         'the DeepSpeed config has a "scheduler" block, but --lr_scheduler_type schedules the learning rate here; '
         'remove the block'),
        ("other_optim_flag", {"optim": "adamw_scale"}, {},
         '--optim adamw_scale cannot run with a DeepSpeed config that has an "optimizer" block (DeepSpeed builds that '
         "optimizer); remove the block to run it as ZeRO's client optimizer, or pass --optim adamw_torch"),
        ("adam_without_adamw_mode", {}, {"optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}},
         '--optim adamw_torch means AdamW, but the DeepSpeed config\'s optimizer is "Adam"; use "type": "AdamW"'),
        ("no_type", {}, {"optimizer": {"params": {}}},
         '--optim adamw_torch means AdamW, but the DeepSpeed config\'s optimizer is null; use "type": "AdamW"'),
        # A number-like value DeepSpeed cannot take: "auto" stands for lr only.
        ("eps_auto", {}, {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "eps": "auto"}}},
         'the DeepSpeed config\'s optimizer has "eps": "auto" but --adam_epsilon gives 1e-08; make them agree '
         '("auto" works for lr only)'),
    )
    def test_refusals_in_full(self, flags, ds_overrides, message):
        with self.assertRaises(UsageError) as raised:
            optim.build_optimizer(torch.nn.Linear(3, 2), _config(**flags), {**_ds_config(), **ds_overrides})
        self.assertEqual(str(raised.exception), message)

    @parameterized.named_parameters(
        # DeepSpeed's Adam is AdamW unless adam_w_mode is false; any case of the type name.
        ("adam", {"type": "Adam", "params": {"lr": "auto"}}),
        ("adam_in_adamw_mode", {"type": "adam", "params": {"lr": "auto", "adam_w_mode": True}}),
        # Keys left out take DeepSpeed's defaults (lr 1e-3, betas 0.9 and 0.999, eps 1e-8): equal to these flags.
        ("no_params", {"type": "AdamW"}),
        ("no_betas_or_eps", {"type": "AdamW", "params": {"lr": 1e-3}}),
    )
    def test_blocks_that_agree_with_the_flags_are_accepted(self, block):
        config = _config(learning_rate=1e-3)
        optimizer = optim.build_optimizer(torch.nn.Linear(3, 2), config, {"optimizer": block})
        self.assertIsInstance(optimizer, DummyOptim)
        self.assertEqual(optimizer.lr, 1e-3)

    def test_numbers_equal_to_the_flags_are_accepted(self):
        ds_config = _ds_config(lr=3e-4, betas=[0.9, 0.98], eps=1e-6)
        config = _config(learning_rate=3e-4, adam_beta2=0.98, adam_epsilon=1e-6)
        self.assertIsInstance(optim.build_optimizer(torch.nn.Linear(3, 2), config, ds_config), DummyOptim)


if __name__ == "__main__":
    absltest.main()
