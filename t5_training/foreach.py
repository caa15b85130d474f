"""The multi-tensor step shared by T5's Adafactor and adamw_scale, and their skip on the device.

`ForeachOptimizer` steps a per-tensor update rule over each parameter group either one tensor at
a time or in chunks with torch's multi-tensor (foreach) ops, and skips a step on the device when
its caller sets `found_inf`, as fused Adam does. The rules live with their optimizers
(adafactor.T5Adafactor, optim.AdamWScale).
"""
from __future__ import annotations

import torch

# A foreach step allocates temporaries for the tensors it updates together (Adafactor: the squared
# gradients and the updates; adamw_scale: the updates), so a group is updated in chunks of at most
# this many elements, or its largest tensor: 64 MiB of fp32, a few chunks for a t5-base.
FOREACH_CHUNK_ELEMENTS = 1 << 24


def foreach_chunks(numels: list[int]) -> list[list[int]]:
    """The indices of a group's tensors (their sizes, in order) split into runs that a foreach step
    updates together: a run closes before the tensor that would take it over the chunk size."""
    bound = max([FOREACH_CHUNK_ELEMENTS, *numels])
    chunks, total = [], bound
    for index, numel in enumerate(numels):
        if total + numel > bound:
            chunks.append([])
            total = 0
        chunks[-1].append(index)
        total += numel
    return chunks


def _closure_loss(closure):
    """What `step(closure)` returns, as torch.optim's optimizers do: the closure recomputes the loss and
    its gradients, so it runs with autograd on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class ForeachOptimizer(torch.optim.Optimizer):
    """A per-tensor update rule (T5's Adafactor, optim.AdamWScale) stepped over each group in
    chunks with torch's multi-tensor ops (`update_together`), or one tensor at a time
    (`update_each`, the reference the tests hold the other to).

    A group's `foreach` chooses; None (the default) is foreach where its tensors are on a GPU, as
    torch's own optimizers choose. On a GPU the multi-tensor ops save the launch of about twenty
    kernels a tensor; on a CPU there is no launch to save, and a tensor's twenty passes run while it
    is in cache, where each multi-tensor op passes over the whole chunk: on a CPU it measured slower
    (docs/results/performance.md#multi-tensor-adafactor).

    A step can be skipped on the device, as fused Adam skips one: where the caller has set
    `found_inf` (a 0-d tensor on the device, 1 to skip, as step.train_step sets it from the loss
    and the gradient norm), a skipped step leaves the weights, the moments and the step counts as
    they were, and zeroes the gradients it was given, with nothing read back to the host. So each
    tensor counts its steps on its device (a 0-d fp32 tensor, as torch's capturable Adam does), and
    the rules weigh what they add by `keep` (1, or 0 on a skipped step).
    """

    def initial_state(self, p: torch.Tensor, group: dict) -> dict:
        """A tensor's state before its first step (its step count aside)."""
        raise NotImplementedError

    def update_each(self, group: dict, params: list[torch.Tensor], states: list[dict], keep: torch.Tensor) -> None:
        raise NotImplementedError

    def update_together(self, group: dict, params: list[torch.Tensor], states: list[dict],
                        keep: torch.Tensor) -> None:
        raise NotImplementedError

    def state_of(self, p: torch.Tensor, group: dict) -> dict:
        """The tensor's state, created at its first step, its step count a 0-d fp32 tensor on its device."""
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state.update(self.initial_state(p, group))
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, with each tensor's state in the dtypes `initial_state` gives it and its step
        count as `state_of` keeps it. torch casts every floating state tensor to its weight's dtype,
        which would round Adafactor's fp32 moments of bf16 weights to bf16, and leaves a step count
        where it was saved (a Python int in checkpoints of earlier versions): those are taken again
        from `state_dict` as saved."""
        super().load_state_dict(state_dict)
        saved_ids = [index for group in state_dict["param_groups"] for index in group["params"]]
        ours = [(p, group) for group in self.param_groups for p in group["params"]]
        for index, (p, group) in zip(saved_ids, ours):
            saved = state_dict["state"].get(index)
            if not saved:
                continue
            state = self.state[p]
            # On the meta device: the dtypes without allocating the state again.
            for key, initial in self.initial_state(p.detach().to("meta"), group).items():
                state[key] = saved[key].to(device=p.device, dtype=initial.dtype)
            state["step"] = torch.as_tensor(saved["step"], dtype=torch.float32).to(p.device)

    def step(self, closure=None):
        loss = _closure_loss(closure)
        # A with block, not @torch.no_grad(): mutmut does not mutate decorated functions.
        with torch.no_grad():
            found_inf = getattr(self, "found_inf", None)
            for group in self.param_groups:
                params = [p for p in group["params"] if p.grad is not None]
                if not params:
                    continue
                keep = _kept(found_inf, params)
                states = [self.state_of(p, group) for p in params]
                # `keep` once per count, a list: given as one tensor, torch would take it for a
                # Python number and read it on the host.
                torch._foreach_add_([state["step"] for state in states], [keep] * len(states))
                foreach = group.get("foreach")
                if not (foreach if foreach is not None else all(p.is_cuda for p in params)):
                    self.update_each(group, params, states, keep)
                    continue
                for chunk in foreach_chunks([p.numel() for p in params]):
                    self.update_together(group, [params[i] for i in chunk], [states[i] for i in chunk], keep)
            return loss


def _kept(found_inf: torch.Tensor | None, params: list[torch.Tensor]) -> torch.Tensor:
    """1 where the step applies, 0 where `found_inf` skips it. A skipped step's gradients may be
    infinite or NaN, which a weight of 0 does not cancel (0 * inf is NaN): they are zeroed."""
    device = params[0].device
    if found_inf is None:
        return torch.ones((), dtype=torch.float32, device=device)
    skip = found_inf.to(device=device, dtype=torch.bool)
    for p in params:
        p.grad.masked_fill_(skip, 0)
    return (~skip).float()


def kept_or_one(factor: float, keep: torch.Tensor) -> torch.Tensor:
    """`factor` where the step applies (keep 1), 1 where it is skipped (keep 0): a decay that leaves a
    skipped step's state as it was. Exactly `factor` in fp32 on an applied step."""
    return keep * factor + (1 - keep)
