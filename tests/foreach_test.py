"""Tests for t5_training.foreach: the multi-tensor step of T5's Adafactor and adamw_scale, and
their skip on the device."""
import contextlib
import copy
import math
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import torch

from t5_training import foreach
from t5_training.adafactor import T5Adafactor
from t5_training.optim import AdamWScale
from tests import fixtures


# The per-tensor rules, as factory(groups, foreach).
_THE_RULES = (
    ("adafactor", lambda groups, foreach: T5Adafactor(groups, lr=1e-2, foreach=foreach)),
    ("adafactor_without_parameter_scale",
     lambda groups, foreach: T5Adafactor(groups, lr=1e-2, multiply_by_parameter_scale=False, foreach=foreach)),
    ("adamw_scale", lambda groups, foreach: AdamWScale(groups, lr=1e-2, foreach=foreach)),
    # Factoring the (32, 4) tensor too.
    ("adafactor_factoring_from_4",
     lambda groups, foreach: T5Adafactor(groups, lr=1e-2, min_dim_size_to_factor=4, foreach=foreach)),
)

# T5's kinds of tensor: factored matrices both ways round, the relative attention bias (too narrow
# to factor), a layer norm, a 3-D tensor, and one that gets no gradient at some steps.
_SHAPES = [(256, 128), (128, 300), (32, 4), (64,), (3, 130, 140), (200, 129)]


def _stepped_pair(factory, dtype=torch.float32, steps=6):
    """Two copies of the same tensors, one stepped by factory(groups, foreach=True), one by
    foreach=False, on the same gradients; returns both sets of weights after `steps` steps."""
    generator = torch.Generator().manual_seed(0)
    initial = [torch.randn(shape, generator=generator).to(dtype) for shape in _SHAPES]
    sides = []
    for together in (True, False):
        params = [torch.nn.Parameter(x.clone()) for x in initial]
        # Two groups as optim.build_optimizer makes them, one with weight decay.
        sides.append((params, factory([{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:]}],
                                      foreach=together)))
    for step in range(steps):
        grads = [torch.randn(shape, generator=generator).to(dtype) for shape in _SHAPES]
        for params, optimizer in sides:
            for i, (param, grad) in enumerate(zip(params, grads)):
                # The last tensor misses every other step: its step count falls behind the others'.
                param.grad = None if i == len(params) - 1 and step % 2 else grad.clone()
            optimizer.step()
    return [p.detach().float() for p in sides[0][0]], [p.detach().float() for p in sides[1][0]]


class ForeachTest(parameterized.TestCase):
    @parameterized.named_parameters(*_THE_RULES)
    def test_the_foreach_step_is_the_loop_to_1e_6(self, factory):
        # In chunks of 40,000 elements too: the tensors then step in four chunks, not one.
        for chunk in (foreach.FOREACH_CHUNK_ELEMENTS, 40_000):
            with mock.patch.object(foreach, "FOREACH_CHUNK_ELEMENTS", chunk):
                together, alone = _stepped_pair(factory)
            for a, b, initial in zip(together, alone, _stepped_pair(factory, steps=0)[0]):
                self.assertFalse(torch.equal(b, initial))  # every tensor moved
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)

    @parameterized.named_parameters(
        ("adafactor", lambda groups, foreach: T5Adafactor(groups, foreach=foreach)),
        ("adamw_scale", lambda groups, foreach: AdamWScale(groups, foreach=foreach)))
    def test_by_default_tensors_on_a_cpu_step_one_at_a_time(self, factory):
        # There is no kernel launch to save on a CPU, and one tensor's passes run while it is in cache.
        param = torch.nn.Parameter(torch.ones(3))
        param.grad = torch.ones(3)
        for choice, method, on_a_gpu in ((None, "update_each", False), (False, "update_each", False),
                                         (True, "update_together", False), (None, "update_together", True),
                                         (False, "update_each", True)):
            optimizer = factory([param], choice)
            with mock.patch.object(type(optimizer), method, autospec=True) as chosen, \
                    mock.patch.object(torch.Tensor, "is_cuda", new_callable=mock.PropertyMock, return_value=on_a_gpu):
                optimizer.step()
            chosen.assert_called_once()

    @parameterized.named_parameters(*[rule for rule in _THE_RULES if rule[0].startswith("adafactor")])
    def test_bf16_weights_step_alike_too(self, factory):
        # Adafactor updates bf16 weights through fp32 copies; the copies must reach the weights.
        # (adamw_scale steps bf16 weights in bf16, its last two operations rounded once one tensor
        # at a time and twice together: alike only to a bf16 rounding.)
        together, alone = _stepped_pair(factory, dtype=torch.bfloat16)
        for a, b in zip(together, alone):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

    @parameterized.named_parameters(
        ("one_chunk", [5, 5, 5], 16, [[0, 1, 2]]),
        ("closes_before_the_tensor_that_would_overflow", [6, 6, 6, 2], 16, [[0, 1], [2, 3]]),
        ("a_tensor_larger_than_the_chunk_sets_the_bound", [30, 5, 20, 5], 16, [[0], [1, 2, 3]]),
        ("none", [], 16, []),
    )
    def test_chunks(self, numels, chunk, expected):
        with mock.patch.object(foreach, "FOREACH_CHUNK_ELEMENTS", chunk):
            self.assertEqual(foreach.foreach_chunks(numels), expected)


@contextlib.contextmanager
def _no_cuda_sync(device: str):
    """On a GPU, CUDA raises at any call that makes the host wait for it."""
    if device != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")

class SkipOnTheDeviceTest(parameterized.TestCase):
    """`found_inf` set to 1 skips a step as fused Adam's does: weights, moments and step counts stay."""

    def _run(self, factory, foreach, schedule, poison=math.inf, start=None, device="cpu"):
        """Steps on gradient sets in `schedule` order, (index, skipped) pairs; a skipped step's first
        gradient holds `poison`. `start`: (weights, optimizer state) to resume from. Returns the
        weights and the optimizer."""
        generator = torch.Generator().manual_seed(0)
        initial = [torch.randn(shape, generator=generator).to(device) for shape in _SHAPES]
        gradients = [[torch.randn(shape, generator=generator).to(device) for shape in _SHAPES] for _ in range(3)]
        params = [torch.nn.Parameter(x.clone()) for x in (start[0] if start else initial)]
        optimizer = factory([{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:]}], foreach=foreach)
        if start:
            optimizer.load_state_dict(start[1])
        for index, skipped in schedule:
            for param, grad in zip(params, gradients[index]):
                param.grad = grad.clone()
            if skipped:
                params[0].grad.view(-1)[:2] = poison
            optimizer.found_inf = torch.full((), float(skipped), device=device)
            # Nothing of the verdict, or of any other tensor, reaches the host: on a GPU a read
            # would wait for the work queued before the step (and CUDA itself raises there).
            with fixtures.host_reads() as reads, _no_cuda_sync(device):
                optimizer.step()
            self.assertEqual(reads, [])
        return params, optimizer

    def _assert_same(self, first, second):
        (params_a, optimizer_a), (params_b, optimizer_b) = first, second
        for a, b in zip(params_a, params_b):
            self.assertTrue(torch.equal(a, b))
        for a, b in zip(params_a, params_b):
            state_a, state_b = optimizer_a.state[a], optimizer_b.state[b]
            self.assertEqual(sorted(state_a), sorted(state_b))
            for key in state_a:
                self.assertTrue(torch.equal(state_a[key], state_b[key]), key)

    @parameterized.named_parameters(
        *[(f"{name}_{kind}_{poison}", factory, foreach, poison)
          for name, factory in _THE_RULES for kind, foreach in (("each", False), ("together", True))
          for poison in (math.inf, math.nan)])
    def test_a_skipped_step_changes_nothing_that_later_steps_see(self, factory, foreach, poison):
        # Bitwise: steps 1 and 3 around a skipped one are steps 1 and 2 of a run without it.
        with_a_skip = self._run(factory, foreach, [(0, False), (1, True), (2, False)], poison)
        without = self._run(factory, foreach, [(0, False), (2, False)])
        self._assert_same(with_a_skip, without)
        self.assertEqual(with_a_skip[1].state[with_a_skip[0][0]]["step"].item(), 2.0)

    @parameterized.named_parameters(
        *[(f"{name}_{kind}", factory, foreach)
          for name, factory in _THE_RULES for kind, foreach in (("each", False), ("together", True))])
    def test_a_skipped_first_step_leaves_fresh_state(self, factory, foreach):
        # The moments are still zero there, where an update of zero gradients would divide 0 by 0.
        skipped = self._run(factory, foreach, [(1, True)])
        fresh = self._run(factory, foreach, [])
        for a, b in zip(skipped[0], fresh[0]):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual({state["step"].item() for state in skipped[1].state.values()}, {0.0})
        self._assert_same(self._run(factory, foreach, [(1, True), (0, False)]),
                          self._run(factory, foreach, [(0, False)]))

    def test_on_a_gpu_the_multi_tensor_step_skips_alike_and_is_the_cpus_loop(self):
        if not torch.cuda.is_available():
            self.skipTest("needs a GPU: T5_TRAINING_TEST_DEVICE=cuda (tools/gpu_check.sh runs it)")
        for name, factory in _THE_RULES:
            with self.subTest(name):
                # foreach None: the multi-tensor step, as on every GPU by default.
                with_a_skip = self._run(factory, None, [(0, False), (1, True), (2, False)], device="cuda")
                without = self._run(factory, None, [(0, False), (2, False)], device="cuda")
                self._assert_same(with_a_skip, without)
                for a, b in zip(without[0], self._run(factory, False, [(0, False), (2, False)])[0]):
                    torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)

    @parameterized.named_parameters(*_THE_RULES)
    def test_a_host_count_from_an_earlier_checkpoint_carries_on(self, factory):
        # Step counts were Python ints before they moved to the device; such a checkpoint resumes.
        params, optimizer = self._run(factory, False, [(0, False)])
        saved = optimizer.state_dict()
        for state in saved["state"].values():
            state["step"] = int(state["step"].item())
        resumed = self._run(factory, False, [(2, False)], start=([p.detach() for p in params], saved))
        self._assert_same(resumed, self._run(factory, False, [(0, False), (2, False)]))


class StateTest(parameterized.TestCase):
    @parameterized.named_parameters(*_THE_RULES)
    def test_state_lives_where_each_tensor_does_in_its_dtype(self, factory):
        # On the tensors' device whatever torch's default dtype and wherever the verdict and a
        # resumed step count come from (torch's load_state_dict leaves a count where it was saved).
        # The meta device stands in for a GPU: nothing there mixes with a CPU tensor unnoticed.
        def meta_params():
            params = [torch.nn.Parameter(torch.zeros(shape, device="meta")) for shape in _SHAPES]
            for p in params:
                p.grad = torch.zeros(p.shape, device="meta")
            return params

        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            for together in (False, True):
                params = meta_params()
                optimizer = factory([{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:]}], together)
                optimizer.step()
                optimizer.found_inf = torch.zeros(())  # on the CPU
                optimizer.step()
                self._assert_on_meta_in_its_dtype(optimizer, params)
                saved = optimizer.state_dict()
                for index, state in saved["state"].items():
                    # As loaded onto the CPU, in another dtype: fp64 here, and fp16.
                    saved["state"][index] = {key: torch.zeros(value.shape, dtype=torch.float16)
                                             for key, value in state.items()}
                    saved["state"][index]["step"] = torch.full((), 2.0)
                resumed_params = meta_params()
                resumed = factory([{"params": resumed_params[:3], "weight_decay": 0.1},
                                   {"params": resumed_params[3:]}], together)
                resumed.load_state_dict(saved)
                resumed.step()
                self._assert_on_meta_in_its_dtype(resumed, resumed_params)
        finally:
            torch.set_default_dtype(default)

    def _assert_on_meta_in_its_dtype(self, optimizer, params):
        # Adafactor's moments in fp32, adamw_scale's in the weights' dtype (fp64 here), each step
        # count in fp32.
        groups = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        for p in params:
            expected = {key: value.dtype for key, value in optimizer.initial_state(p, groups[id(p)]).items()}
            for key, value in optimizer.state[p].items():
                self.assertEqual((value.device.type, value.dtype), ("meta", expected.get(key, torch.float32)), key)

    def test_resumed_bf16_weights_keep_fp32_moments_and_step_as_without_a_stop(self):
        # torch's load_state_dict casts state to the weights' dtype: bf16 moments would round
        # every later step differently from a run that never stopped.
        generator = torch.Generator().manual_seed(0)
        initial = [torch.randn(shape, generator=generator).to(torch.bfloat16) for shape in _SHAPES]
        gradients = [[torch.randn(shape, generator=generator).to(torch.bfloat16) for shape in _SHAPES]
                     for _ in range(2)]

        def stepped(weights, steps, state=None):
            params = [torch.nn.Parameter(w.clone()) for w in weights]
            optimizer = T5Adafactor(params)
            if state:
                optimizer.load_state_dict(copy.deepcopy(state))
            for grads in steps:
                # The first tensor gets no gradient: it has no state to resume.
                for p, g in zip(params[1:], grads[1:]):
                    p.grad = g.clone()
                optimizer.step()
            return params, optimizer

        through, uninterrupted = stepped(initial, gradients)
        stopped, before = stepped(initial, gradients[:1])
        resumed, after = stepped([p.detach() for p in stopped], gradients[1:], before.state_dict())
        for a, b in zip(through, resumed):
            self.assertTrue(torch.equal(a, b))
            for key, value in after.state[b].items():
                self.assertEqual(value.dtype, torch.float32, key)
                self.assertTrue(torch.equal(value, uninterrupted.state[a][key]), key)

    @parameterized.named_parameters(*_THE_RULES)
    def test_a_group_without_gradients_leaves_the_next_group_to_step(self, factory):
        idle, moved = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
        moved.grad = torch.ones(3)
        factory([{"params": [idle]}, {"params": [moved]}], None).step()
        self.assertTrue(torch.equal(idle.detach(), torch.ones(3)))
        self.assertFalse(torch.equal(moved.detach(), torch.ones(3)))


_STEP_PEAKS = """
import json, torch
from t5_training.adafactor import T5Adafactor
from t5_training.optim import AdamWScale
from tests import fixtures
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))
peaks = {}
for name, factory in (("adafactor", T5Adafactor), ("adamw_scale", AdamWScale)):
    for foreach in (False, True):
        params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(2048, 1024)] * 3 + [(1024,)] * 4 + [(512, 512)]]
        for p in params:
            p.grad = torch.randn(p.shape)
        optimizer = factory(params, foreach=foreach)
        optimizer.step()  # the state exists from here on
        resident = kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak (VmHWM) starts again from what is resident now
        optimizer.step()
        peaks[f"{name} {foreach}"] = (kib("VmHWM") - resident) / 1024
        del params, optimizer
print(json.dumps(peaks))
"""


class StepMemoryTest(absltest.TestCase):
    def test_a_step_holds_one_copy_of_what_it_updates_at_once(self):
        # What the memory estimator counts for a step (tools/optimizer_memory.py, step_temporaries): one
        # tensor's worth of temporaries one tensor at a time (8 MiB here), one chunk's together
        # (all 25 MiB here), for both optimizers. Large allocations are mapped and unmapped at once,
        # so that resident memory follows live tensors.
        import json
        import os
        import subprocess
        import sys
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-c", _STEP_PEAKS], capture_output=True, text=True, env=env, check=True)
        peaks = json.loads(done.stdout)
        self.assertLen(peaks, 4)
        for case, mib in peaks.items():
            expected = 25 if case.endswith("True") else 8
            self.assertBetween(mib, 0.9 * expected, 1.1 * expected, case)


if __name__ == "__main__":
    absltest.main()
