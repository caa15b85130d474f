"""Tests for t5_training.adafactor: Mesh TF's update rule worked by hand and its size on a t5-small
matrix (its multi-tensor step and its skip on the device: foreach_test.py)."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import torch
import transformers
from transformers.optimization import Adafactor

from t5_training.adafactor import T5Adafactor, factored_dims


def _step(param: torch.nn.Parameter, optimizer, grad) -> None:
    param.grad = torch.tensor(grad, dtype=torch.float32)
    optimizer.step()


def _rms(values):
    flat = [v for row in values for v in row] if isinstance(values[0], list) else values
    return math.sqrt(sum(v * v for v in flat) / len(flat))


def _reference_matrix_step(x, g, rows, cols, step, lr, factored):
    """Mesh TF's Adafactor on a 2 x 3 matrix in plain Python: the update rule, element by element.

    rows/cols hold the running second moments (R over the 2 rows, C over the 3 columns) or, when
    not factored, `rows` holds the full 2 x 3 moment. Returns the new value and moments.
    """
    decay = 1 - step ** -0.8
    sq = [[v * v + 1e-30 for v in row] for row in g]
    if factored:
        rows = [decay * r + (1 - decay) * sum(sq[i]) / 3 for i, r in enumerate(rows)]
        cols = [decay * c + (1 - decay) * (sq[0][j] + sq[1][j]) / 2 for j, c in enumerate(cols)]
        mean_r = sum(rows) / 2
        u = [[g[i][j] / math.sqrt(rows[i] * cols[j] / mean_r) for j in range(3)] for i in range(2)]
    else:
        rows = [[decay * rows[i][j] + (1 - decay) * sq[i][j] for j in range(3)] for i in range(2)]
        u = [[g[i][j] / math.sqrt(rows[i][j]) for j in range(3)] for i in range(2)]
    clip = max(1.0, _rms(u) / 1.0)
    scale = lr * max(_rms(x), 1e-3)
    x = [[x[i][j] - scale * u[i][j] / clip for j in range(3)] for i in range(2)]
    return x, rows, cols


class UpdateRuleTest(parameterized.TestCase):

    def test_vector_one_and_two_steps_golden(self):
        # Step 1: beta2 = 1 - 1^-0.8 = 0, so V = g^2 and u = g / |g| = [1, 1] (RMS 1, no clipping);
        # the step is lr * RMS(x) = 0.1 * sqrt(12.5) = 0.353553 on each element.
        # Step 2: beta2 = 1 - 2^-0.8 = 0.425651; V = beta2 [1, 4] + (1 - beta2) [4, 1] = [2.723048, 2.276953],
        # u = [2, 1] / sqrt(V) = [1.211999, 0.662713] (RMS 0.9768, no clipping), RMS(x) = 3.185930.
        param = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
        optimizer = T5Adafactor([param], lr=0.1)
        _step(param, optimizer, [1.0, 2.0])
        torch.testing.assert_close(param.detach(), torch.tensor([2.646447, 3.646447]), atol=1e-6, rtol=0)
        _step(param, optimizer, [2.0, 1.0])
        torch.testing.assert_close(param.detach(), torch.tensor([2.260313, 3.435312]), atol=2e-6, rtol=0)

    @parameterized.named_parameters(("factored", 2, True), ("below_the_threshold", 128, False))
    def test_matrix_two_steps_against_the_rule(self, min_dim, factored):
        x = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]
        grads = [[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[-2.0, 0.5, 1.0], [3.0, -1.0, 0.1]]]
        param = torch.nn.Parameter(torch.tensor(x))
        optimizer = T5Adafactor([param], lr=0.05, min_dim_size_to_factor=min_dim)
        rows, cols = ([0.0, 0.0], [0.0, 0.0, 0.0]) if factored else ([[0.0] * 3, [0.0] * 3], None)
        for step, g in enumerate(grads, start=1):
            x, rows, cols = _reference_matrix_step(x, g, rows, cols, step, lr=0.05, factored=factored)
            _step(param, optimizer, g)
            torch.testing.assert_close(param.detach(), torch.tensor(x), atol=1e-6, rtol=0)
        state = optimizer.state[param]
        self.assertEqual(sorted(state), ["col", "row", "step"] if factored else ["second_moment", "step"])

    def test_factored_first_step_is_not_the_unfactored_one(self):
        # The check above could pass with factoring ignored only if the two rules agreed: they do not.
        params = [torch.nn.Parameter(torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])) for _ in range(2)]
        for param, min_dim in zip(params, (2, 128)):
            _step(param, T5Adafactor([param], lr=0.05, min_dim_size_to_factor=min_dim), [[1.0, 2.0, 3.0],
                                                                                         [4.0, 5.0, 6.0]])
        self.assertGreater((params[0] - params[1]).abs().max().item(), 1e-3)

    @parameterized.named_parameters(("at_one", {}, 0.1), ("at_a_half", {"clipping_threshold": 0.5}, 0.05))
    def test_update_rms_is_clipped_at_the_threshold(self, kwargs, step_rms):
        # Factored with one huge gradient: u's RMS exceeds the threshold d, so the step is
        # lr * RMS(x) * u * d / RMS(u), whose RMS is lr * d (RMS(x) = 1).
        param = torch.nn.Parameter(torch.ones(2, 2))
        optimizer = T5Adafactor([param], lr=0.1, min_dim_size_to_factor=2, **kwargs)
        param.grad = torch.tensor([[100.0, 0.0], [0.0, 1.0]])
        before = param.detach().clone()
        optimizer.step()
        delta = before - param.detach()
        self.assertAlmostEqual(delta.pow(2).mean().sqrt().item(), step_rms, places=6)

    def test_three_dims_factor_over_the_two_largest(self):
        # A 2 x 3 x 4 tensor factored over its last two dimensions (4 largest, then 3), at the
        # first step (V = g^2): R[i][j] = mean_k g^2, C[i][k] = mean_j g^2, and
        # u = g / sqrt(R[i][j] C[i][k] / mean_j R[i][j]), Mesh TF's rule per leading index i.
        g = [[[(i + 1) * (j - 1.5) + k * k / 4 for k in range(4)] for j in range(3)] for i in range(2)]
        sq = [[[v * v + 1e-30 for v in row] for row in plane] for plane in g]
        r = [[sum(row) / 4 for row in plane] for plane in sq]
        c = [[sum(plane[j][k] for j in range(3)) / 3 for k in range(4)] for plane in sq]
        mean_r = [sum(row) / 3 for row in r]
        u = [[[g[i][j][k] / math.sqrt(r[i][j] * c[i][k] / mean_r[i]) for k in range(4)] for j in range(3)]
             for i in range(2)]
        flat_u = [v for plane in u for row in plane for v in row]
        clip = max(1.0, _rms(flat_u))
        param = torch.nn.Parameter(torch.ones(2, 3, 4))  # RMS(x) = 1: the step is lr * u / clip
        optimizer = T5Adafactor([param], lr=0.1, min_dim_size_to_factor=3)
        param.grad = torch.tensor(g)
        optimizer.step()
        expected = torch.tensor([[[1 - 0.1 * v / clip for v in row] for row in plane] for plane in u])
        torch.testing.assert_close(param.detach(), expected, atol=1e-6, rtol=0)
        self.assertEqual(optimizer.state[param]["row"].shape, (2, 3, 1))
        self.assertEqual(optimizer.state[param]["col"].shape, (2, 1, 4))

    def test_a_parameter_without_a_gradient_is_left_alone_and_the_rest_step(self):
        frozen, trained = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.tensor([3.0, 4.0]))
        optimizer = T5Adafactor([frozen, trained], lr=0.1)
        trained.grad = torch.tensor([1.0, 2.0])
        optimizer.step()
        torch.testing.assert_close(frozen.detach(), torch.ones(2), atol=0, rtol=0)
        self.assertNotIn(frozen, optimizer.state)
        torch.testing.assert_close(trained.detach(), torch.tensor([2.646447, 3.646447]), atol=1e-6, rtol=0)

    def test_step_returns_the_closures_loss(self):
        param = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
        optimizer = T5Adafactor([param], lr=0.1)
        param.grad = torch.tensor([1.0, 2.0])
        self.assertIsNone(optimizer.step())
        self.assertEqual(optimizer.step(closure=lambda: 2.5), 2.5)
        self.assertEqual(optimizer.state[param]["step"], 2)

    def test_a_closure_computes_its_gradients_and_steps_as_a_backward_before_step_does(self):
        # torch.optim's contract: the closure recomputes the loss and its gradients, so it runs with grad
        # enabled (inside the update's no_grad it could not call backward).
        by_closure, by_hand = (torch.nn.Parameter(torch.tensor([3.0, -4.0])) for _ in range(2))
        optimizer = T5Adafactor([by_closure], lr=0.1)

        def closure():
            optimizer.zero_grad()
            loss = (by_closure ** 3).sum()
            loss.backward()
            return loss

        self.assertEqual(optimizer.step(closure).item(), 27.0 - 64.0)
        (by_hand ** 3).sum().backward()
        T5Adafactor([by_hand], lr=0.1).step()
        torch.testing.assert_close(by_closure.data, by_hand.data, rtol=0, atol=0)
        self.assertFalse(torch.equal(by_closure.data, torch.tensor([3.0, -4.0])))

    def test_zero_initialised_tensor_moves_by_lr_times_eps2(self):
        param = torch.nn.Parameter(torch.zeros(3))
        optimizer = T5Adafactor([param], lr=0.5)
        _step(param, optimizer, [1.0, -2.0, 4.0])
        torch.testing.assert_close(param.detach(), torch.tensor([-5e-4, 5e-4, -5e-4]))

    @parameterized.named_parameters(
        # Absolute step: x = (1 - 0.1 * 0.5) x - 0.1 u = 0.95 [3, 4] - 0.1 [1, 1] = [2.75, 3.7].
        ("absolute_step", False, [2.75, 3.7]),
        # Relative step: the scale is RMS of x before the decay, lr * sqrt(12.5) = 0.353553, so
        # x = 0.95 [3, 4] - 0.353553 = [2.496447, 3.446447].
        ("parameter_scaled_step", True, [2.496447, 3.446447]),
    )
    def test_weight_decay_shrinks_by_lr_times_the_rate(self, multiply_by_parameter_scale, expected):
        # Decoupled decay scaled by the learning rate, as AdamW's: x *= 1 - lr * wd. A decay of
        # 1 - wd (here 0.5) would halve the weights every step whatever the schedule.
        param = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
        optimizer = T5Adafactor([param], lr=0.1, weight_decay=0.5,
                                multiply_by_parameter_scale=multiply_by_parameter_scale)
        _step(param, optimizer, [1.0, 2.0])  # first step: u = g / |g| = [1, 1], as in the golden test above
        torch.testing.assert_close(param.detach(), torch.tensor(expected), atol=1e-6, rtol=0)

    def test_bf16_weights_are_updated_in_fp32(self):
        param = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.bfloat16))
        optimizer = T5Adafactor([param], lr=0.1)
        param.grad = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
        optimizer.step()
        self.assertEqual(param.dtype, torch.bfloat16)
        self.assertEqual(optimizer.state[param]["second_moment"].dtype, torch.float32)
        torch.testing.assert_close(param.detach().float(), torch.tensor([2.646447, 3.646447]), atol=2e-2, rtol=0)

    def test_bf16_weights_keep_factored_moments_in_fp32(self):
        param = torch.nn.Parameter(torch.ones(2, 3, dtype=torch.bfloat16))
        optimizer = T5Adafactor([param], lr=0.1, min_dim_size_to_factor=2)
        param.grad = torch.ones(2, 3, dtype=torch.bfloat16)
        optimizer.step()
        self.assertEqual([optimizer.state[param][k].dtype for k in ("row", "col")], [torch.float32] * 2)

    @parameterized.named_parameters(
        ("zero_lr", {"lr": 0.0}), ("negative_lr", {"lr": -1e-3}), ("zero_clipping", {"clipping_threshold": 0.0}),
        ("negative_clipping", {"clipping_threshold": -1.0}), ("zero_decay_exponent", {"decay_exponent": 0.0}),
        ("decay_exponent_above_one", {"decay_exponent": 1.01}))
    def test_bad_settings_are_refused(self, kwargs):
        with self.assertRaisesRegex(ValueError, r"^T5Adafactor needs lr > 0, clipping_threshold > 0 and "
                                                r"0 < decay_exponent <= 1$"):
            T5Adafactor([torch.nn.Parameter(torch.ones(2))], **kwargs)

    def test_the_defaults_are_t5s(self):
        # Mesh TF's defaults as the module docstring gives them, and T5's pretraining rate 1e-2.
        self.assertEqual(T5Adafactor([torch.nn.Parameter(torch.ones(2))]).defaults,
                         {"lr": 1e-2, "eps": (1e-30, 1e-3), "clipping_threshold": 1.0, "decay_exponent": 0.8,
                          "multiply_by_parameter_scale": True, "min_dim_size_to_factor": 128, "weight_decay": 0.0,
                          "foreach": None})

    def test_the_edges_of_the_settings_are_accepted(self):
        T5Adafactor([torch.nn.Parameter(torch.ones(2))], lr=1e-9, clipping_threshold=1e-9, decay_exponent=1.0)


class FactoredDimsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("vector", (512,), None),
        ("small_matrix", (100, 100), None),
        ("relative_attention_bias", (32, 8), None),
        ("one_small_dim", (32128, 64), None),
        ("query", (512, 512), (0, 1)),
        ("wide", (128, 512), (1, 0)),
        ("embedding", (32128, 512), (0, 1)),
        ("three_dims", (4, 256, 128), (1, 2)),
    )
    def test_as_mesh_tf(self, shape, expected):
        self.assertEqual(factored_dims(torch.Size(shape)), expected)


def _t5_small_query_relative_update(optimizer_factory) -> float:
    """||dW|| / ||W|| of the first layer's attention query after one step at lr 1e-2, t5-small's shape and init."""
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=256, d_model=512, d_ff=2048, d_kv=64, num_heads=8, num_layers=1,
                                   num_decoder_layers=1, dropout_rate=0.0, pad_token_id=0,
                                   eos_token_id=1, decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    query = model.encoder.block[0].layer[0].SelfAttention.q.weight
    ids = torch.randint(2, 256, (4, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    before = query.detach().clone()
    optimizer_factory(model.parameters()).step()
    return ((query.detach() - before).norm() / before.norm()).item()


class T5SmallScaleTest(absltest.TestCase):

    def test_query_moves_by_about_one_percent(self):
        relative = _t5_small_query_relative_update(lambda params: T5Adafactor(params, lr=1e-2))
        self.assertGreater(relative, 0.005)
        self.assertLess(relative, 0.0125)

    def test_hfs_external_lr_variant_moves_it_by_more_than_its_norm(self):
        # The query's init std is (d_model * d_kv)^-0.5 = 0.0055, so an absolute step of ~1e-2 per
        # element is ~180% of the matrix: what the project trained with before (adafactor_hf).
        relative = _t5_small_query_relative_update(
            lambda params: Adafactor(params, lr=1e-2, scale_parameter=False, relative_step=False))
        self.assertGreater(relative, 1.0)


if __name__ == "__main__":
    absltest.main()
