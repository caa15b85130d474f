"""A symbolic autograd tape: the storages each node of one training step saves, and the peak of
activations plus gradients while backward walks the nodes in reverse.

`t5_training.tools.activation_memory` records T5's forward on it op by op; this module knows only
how torch's ops save tensors and how backward frees them, nothing of T5's layout.
"""
from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Storage:
    """A tensor as memory sees it: its storage (key), elements, bytes per element, requires_grad."""

    key: int
    numel: int
    itemsize: int
    rg: bool


class Tape:
    """Runs T5's forward symbolically, op by op as modeling_t5.py and torch run it, recording for
    each autograd node the storages it saves and the gradients that exist while backward runs it."""

    def __init__(self, *, device: str, precision: str, pure16: bool, dropout: float, checkpointing: bool):
        self.cpu, self.dropout_rate, self.checkpointing = device == "cpu", dropout, checkpointing
        self.autocast = precision != "fp32" and not pure16  # fp32 weights, 16-bit matmuls
        self.weight_bytes = 2 if pure16 else 4
        self.clamp = pure16 and precision == "fp16"  # T5Block clamps fp16 hidden states
        self.bytes: dict[int, int] = {}  # storage key -> bytes
        self.nodes: list[tuple[int, list[int], int]] = []  # (stage, keys saved, gradient bytes), forward order
        self.kept = collections.defaultdict(set)  # stage (a checkpointed layer) -> inputs kept for recompute
        self.stage = 0
        self._keys = itertools.count()

    def new(self, numel: int, itemsize: int, rg: bool) -> Storage:
        t = Storage(next(self._keys), numel, itemsize, rg)
        self.bytes[t.key] = numel * itemsize
        return t

    def node(self, saves: Sequence[tuple[Storage, bool]], grads: Sequence[Storage]) -> None:
        """One autograd node: the tensors it saves (each when its condition holds) and the gradients
        alive while backward runs it: its output's and its inputs' (those that require grad)."""
        keys = [t.key for t, when in saves if when and t.numel]
        self.nodes.append((self.stage, keys, sum(t.numel * t.itemsize for t in grads if t.rg)))

    def saved_by(self, stage: int | None = None) -> set[int]:
        return {key for s, keys, _ in self.nodes if stage is None or s == stage for key in keys}

    def cast(self, t: Storage, itemsize: int) -> Storage:
        return t if t.itemsize == itemsize else self.new(t.numel, itemsize, t.rg)

    def add(self, a: Storage, b: Storage) -> Storage:  # saves nothing; the gradient passes through
        return self.new(a.numel, max(a.itemsize, b.itemsize), a.rg or b.rg)

    def mul(self, a: Storage, b: Storage) -> Storage:  # each factor is saved for the other's gradient
        out = self.add(a, b)
        self.node([(a, b.rg), (b, a.rg)], [out, a, b])
        return out

    def linear(self, x: Storage, n_in: int, n_out: int, trainable: bool) -> Storage:
        """nn.Linear(bias=False): the input for the weight's gradient; under autocast a 16-bit copy
        of the input and, for the input's gradient, of the weight."""
        x = self.cast(x, 2) if self.autocast else x
        out = self.new(x.numel // n_in * n_out, x.itemsize, x.rg or trainable)
        self.node([(x, trainable), (self.new(n_in * n_out, 2, False), self.autocast and x.rg)], [out, x])
        return out

    def layer_norm(self, x: Storage, tokens: int, trainable: bool) -> Storage:
        """T5LayerNorm: fp32 variance (pow saves x); x * rsqrt(variance) saves both; weight * that
        saves the normalized value for the weight's gradient."""
        x32, rsqrt = self.cast(x, 4), self.new(tokens, 4, x.rg)
        normed = self.cast(self.new(x.numel, 4, x.rg), self.weight_bytes)
        out = self.new(x.numel, normed.itemsize, x.rg or trainable)
        self.node([(x32, x.rg), (x, x.rg), (rsqrt, x.rg), (normed, trainable)], [out, x32])
        return out

    def dropout(self, x: Storage, rate: float | None = None) -> Storage:
        """CPU dropout multiplies by a float mask of x's dtype; CUDA's fused kernel keeps a bool mask.
        `rate` is the model's dropout unless given (LoRA's own)."""
        if (self.dropout_rate if rate is None else rate) == 0:
            return x  # F.dropout with p=0 returns its input
        out = self.new(x.numel, x.itemsize, x.rg)
        self.node([(self.new(x.numel, x.itemsize if self.cpu else 1, False), x.rg)], [out, x])
        return out

    def relu(self, x: Storage) -> Storage:
        out = self.new(x.numel, x.itemsize, x.rg)
        self.node([(out, x.rg)], [out, x])
        return out

    def gelu(self, x: Storage) -> Storage:
        """torch's tanh GELU, as `modeling.fuse_gelu` runs T5 v1.1's gelu_new: one kernel that saves
        its input and returns x's dtype (autocast leaves it alone)."""
        out = self.new(x.numel, x.itemsize, x.rg)
        self.node([(x, x.rg)], [out, x])
        return out

    def attention(self, q: Storage, k: Storage, v: Storage, bias: Storage, *, batch: int, heads: int, queries: int, keys: int) -> Storage:
        """scaled_dot_product_attention with T5's additive float mask (position bias, min where masked).

        With a mask that needs a gradient (the relative position bias being trained), torch runs
        its math kernel on either device, and on the CPU with dropout too: in fp32 whatever the
        inputs' dtype, it keeps reshaped copies of q, k, v, the softmax output and, with dropout,
        its mask and result (three L x L tensors; CUDA's mask is 1 byte). Otherwise (CPU flash
        attention; memory-efficient or cuDNN attention on CUDA) it keeps q, k, v, the mask, its
        output and the log-sum-exp; nothing L x L but the mask (and its gradient, in backward).
        Measured on an H200 (torch 2.11): self-attention, whose bias trains, ran the math kernel in
        fp32 and in bf16 autocast; cross-attention, whose bias is constant, a fused kernel.
        """
        rg = q.rg or k.rg or v.rg or bias.rg
        mask_grad = self.new(batch * heads * queries * keys, bias.itemsize, bias.rg)
        if bias.rg or (self.cpu and self.dropout_rate > 0):
            q32, k32, v32 = (self.new(t.numel, 4, t.rg) for t in (q, k, v))
            scores = self.new(batch * heads * queries * keys, 4, q.rg or k.rg or bias.rg)
            self.node([(q32, k.rg), (k32, q.rg)], [scores, q32, k32, mask_grad])  # q @ k^T + mask
            probs = self.new(scores.numel, 4, scores.rg)
            self.node([(probs, scores.rg)], [probs, scores])  # softmax
            attn = self.dropout(probs)
            out = self.new(q.numel, 4, rg)
            self.node([(attn, v.rg), (v32, attn.rg)], [out, attn, v32])  # probs @ v
            return self.new(q.numel, q.itemsize, rg)  # back to q's dtype, heads merged (a copy)
        mask = self.cast(bias, q.itemsize)  # autocast casts the mask with q, k, v
        if not self.cpu and keys % 16:
            mask = self.new(mask.numel // keys * (-(-keys // 16) * 16), mask.itemsize, mask.rg)  # aligned copy
        out = self.new(q.numel, q.itemsize, rg)  # laid out so that merging heads needs no copy
        lse = self.new(batch * heads * (queries if self.cpu else -(-queries // 32) * 32), 4, False)
        self.node([(t, rg) for t in (q, k, v, mask, out, lse)], [out, q, k, v, mask_grad])
        return out


def activation_profile(tape: Tape, stages: list[str]) -> list[tuple[int, int]]:
    """For each autograd node, in forward order: (its stage, the bytes of activations alive while
    backward runs it plus the gradients it needs meanwhile). Backward runs the nodes in reverse and
    frees a saved tensor once it has run the first node that saved it. With checkpointing, a layer
    keeps only its inputs, and its own tensors exist again while backward is inside it."""
    blocks = {s for s, name in enumerate(stages) if " layer " in name}
    checkpointed = tape.checkpointing and bool(blocks)
    profile = []
    alive: set[int] = set()  # saved outside checkpointed layers, by this node or an earlier one
    alive_bytes = 0
    kept: set[int] = set()  # inputs of the checkpointed layers so far
    layer: set[int] = set()  # saved by the checkpointed layer of this node, up to this node
    for i, (stage, keys, grads) in enumerate(tape.nodes):
        if checkpointed and stage in blocks:
            if i == 0 or tape.nodes[i - 1][0] != stage:
                layer = set()
                kept |= tape.kept[stage]
            layer.update(keys)
        else:
            layer = set()
            for key in keys:
                if key not in alive:
                    alive.add(key)
                    alive_bytes += tape.bytes[key]
        extra = ((kept | layer) - alive) if checkpointed else ()
        profile.append((stage, alive_bytes + sum(tape.bytes[k] for k in extra) + grads))
    return profile
