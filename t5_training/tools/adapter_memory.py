"""What an adapter (`--peft lora|ia3|prompt_tuning`) changes in the memory estimate.

`describe` wraps a T5 built on the `meta` device with the adapter exactly as fine_tune_t5.py
does (`t5_training.adapters.apply`, so the same defaults and the same bad-target errors apply) and
reads off every parameter's shape, which of them train (the adapter's only), and which linear
layers carry LoRA or IA3. The activation tracer (`activation_memory`) then adds, per adapted
layer, what autograd saves for it, following peft's forwards:

    LoRA   result + lora_B(lora_A(dropout(x))) * scaling: lora_A saves its input (x itself
           without LoRA dropout, which the layer's other LoRA branches share; else the dropped
           copy and its mask), lora_B saves the r-wide hidden; under autocast each also keeps
           a 16-bit copy of its input and weight.
    DoRA   (--use_dora) LoRA's two layers on dropout(x), then result + (m / n - 1) * base +
           (m / n) * update * scaling, with n the weight's column norms (no gradient): m / n saves n,
           each product saves its two factors; with LoRA dropout `base` is the frozen layer run
           again on the dropped x; the sum is cast back to the output's dtype. (B·A and the norm
           are built and dropped within the forward.)
    IA3    result * l (k, v: the output scaled) or base(x * l) (wo: the input scaled): the
           product saves the scaled tensor for l's gradient and l for the tensor's.
    prompt the encoder reads num_virtual_tokens more positions: every encoder activation, and
           the cross-attention over it, grows with source + n. The prompt lookup saves its ids.

Frozen base weights still pass gradients through: once an adapter output needs a gradient,
everything after it keeps what backward needs for its inputs (not for its frozen weights).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import torch


@dataclass(frozen=True)
class AdapterLayers:
    """An adapted model as memory sees it. Names are the base model's (peft's prefixes removed)."""

    shapes: Mapping[str, tuple[int, ...]]  # every parameter, tied weights once
    trainable: frozenset[str]
    lora: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # module -> (r, dropout)
    dora: frozenset[str] = frozenset()  # LoRA modules that are DoRA's
    ia3: Mapping[str, bool] = field(default_factory=dict)  # module -> scales its input (feed-forward)
    prompt_tokens: int = 0
    method: str = "none"

    def describe_method(self) -> str:
        """A few words for the estimate's heading, e.g. "LoRA r=8 on q,v"."""
        leaves = lambda modules: ",".join(sorted({name.rsplit(".", 1)[-1] for name in modules}))  # noqa: E731
        if self.lora:
            return f"{'DoRA' if self.dora else 'LoRA'} r={next(iter(self.lora.values()))[0]} on {leaves(self.lora)}"
        if self.ia3:
            return f"IA3 on {leaves(self.ia3)}"
        return f"prompt tuning, {self.prompt_tokens} soft tokens"


def base_name(name: str) -> str:
    """A peft parameter's name as the base model's layout has it: no wrapper prefix, no adapter name."""
    return name.removeprefix("base_model.").removeprefix("model.").replace(".default.", ".").removesuffix(".default")


def describe(model_config, adapter_config) -> AdapterLayers:
    """`adapter_config` (a t5_training.adapters.AdapterConfig with --peft set) applied to a T5 shaped
    by `model_config`, on the meta device: no memory, exact counts."""
    from t5_training import adapters, modeling

    # The prompt's initial values do not change its size; "random" needs no tokenizer.
    adapter_config = dataclasses.replace(adapter_config, prompt_init="random", prompt_init_text=None)
    with torch.device("meta"):
        model = adapters.apply(modeling.fresh_model(model_config), adapter_config)
    params = dict(model.named_parameters())
    lora, dora, ia3 = {}, set(), {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            dropout = module.lora_dropout["default"]
            lora[base_name(name)] = (module.r["default"], getattr(dropout, "p", 0.0))
            if "default" in getattr(module, "lora_magnitude_vector", {}):
                dora.add(base_name(name))
        elif hasattr(module, "ia3_l") and "default" in module.ia3_l:
            ia3[base_name(name)] = bool(module.is_feedforward)
    prompt = model.active_peft_config.num_virtual_tokens if adapters.is_prompt_tuned(model) else 0
    return AdapterLayers(shapes={base_name(n): tuple(p.shape) for n, p in params.items()},
                         trainable=frozenset(base_name(n) for n, p in params.items() if p.requires_grad),
                         lora=lora, dora=frozenset(dora), ia3=ia3, prompt_tokens=prompt, method=adapter_config.peft)


def linear(tape, layers: AdapterLayers | None, module: str, x, n_in: int, n_out: int, trainable: bool):
    """nn.Linear named `module`, with the LoRA or IA3 adapter peft put on it, if any, traced on `tape`."""
    if layers is not None and module in layers.ia3:
        scale = tape.new(n_in if layers.ia3[module] else n_out, tape.weight_bytes, True)  # 1 * l: a new tensor
        if layers.ia3[module]:  # (x.to(l's dtype) * l).to(x's dtype), then the frozen layer
            return tape.linear(tape.cast(tape.mul(tape.cast(x, scale.itemsize), scale), x.itemsize), n_in, n_out,
                               trainable)
        out = tape.linear(x, n_in, n_out, trainable)
        return tape.cast(tape.mul(out, scale), out.itemsize)  # (result * l).to(result's dtype)
    out = tape.linear(x, n_in, n_out, trainable)
    if layers is None or module not in layers.lora:
        return out
    r, dropout = layers.lora[module]
    dropped = tape.dropout(x, rate=dropout)
    update = tape.linear(tape.linear(dropped, n_in, r, True), r, n_out, True)
    if module not in layers.dora:
        return tape.add(out, tape.new(update.numel, update.itemsize, True))  # * scaling: a float, nothing saved
    norm = tape.new(n_out, x.itemsize, False)  # in the input's dtype, as the weight is cast to it
    scale = tape.new(n_out, max(norm.itemsize, tape.weight_bytes), True)  # magnitude / norm
    tape.node([(norm, True)], [scale])
    base = out if dropped is x else tape.linear(dropped, n_in, n_out, False)
    kept = tape.mul(tape.new(n_out, scale.itemsize, True), base)  # (scale - 1) * base
    # The last * scaling saves nothing; the sum goes back to the layer's output dtype (16-bit under autocast).
    return tape.cast(tape.add(out, tape.add(kept, tape.mul(scale, update))), out.itemsize)


def prompt(tape, embedded, *, batch: int, tokens: int, d_model: int):
    """The soft prompt put before the embedded input: cat([prompt_encoder(ids), embedded], dim=1)."""
    soft = tape.new(batch * tokens * d_model, embedded.itemsize, True)
    tape.node([(tape.new(tokens, 8, False), True)], [soft])  # the ids: an expanded view of n int64s
    return tape.new(soft.numel + embedded.numel, embedded.itemsize, True)  # cat saves nothing
