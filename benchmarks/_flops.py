"""Model FLOPs of a T5 training step, for benchmarks/pretraining_mfu.py: counted analytically,
and checked against torch.utils.flop_counter."""
from __future__ import annotations

import torch

from t5_training.losses import forward_loss_sum


def analytic_flops(config, batch_size: int, source: int, target: int) -> dict:
    """Forward matmul FLOPs of one batch by part (see pretraining_mfu.py's docstring); a training step is 3x the total."""
    d, i, f, v = config.d_model, config.num_heads * config.d_kv, config.d_ff, config.vocab_size
    ff = (3 if config.is_gated_act else 2) * d * f
    le, ld = config.num_layers, config.num_decoder_layers
    parts = {
        "encoder_linear": 2 * le * source * (4 * d * i + ff),
        "decoder_linear": 2 * ld * target * (6 * d * i + ff),
        "cross_attention_kv": 2 * ld * source * 2 * d * i,
        "lm_head": 2 * target * d * v,
        "attention": 2 * 2 * i * (le * source * source + ld * (target * target + target * source)),
    }
    parts = {name: batch_size * value for name, value in parts.items()}
    parts["forward"] = sum(parts.values())
    parts["train_step"] = 3 * parts["forward"]
    return parts


def counted_flops(model, batch: dict) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs of one batch as torch.utils.flop_counter counts them."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    # The CPU flash-attention kernel SDPA dispatches to is missing from FlopCounterMode's table.
    mapping = {aten._scaled_dot_product_flash_attention_for_cpu:
               lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v),
               aten._scaled_dot_product_flash_attention_for_cpu_backward:
               lambda g, q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_backward_flop_count(g, q, k, v)}
    with flop_counter.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        loss = forward_loss_sum(model, batch)
    forward = counter.get_total_flops()
    with flop_counter.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        forward_loss_sum(model, batch).backward()
    model.zero_grad(set_to_none=True)
    del loss
    return forward, counter.get_total_flops()


def check_flops(model, config, batch: dict) -> dict:
    """The analytic count of one sequence (`batch`, of 1 row) against FlopCounterMode's (which does not
    depend on dtype or device)."""
    source, target = batch["input_ids"].shape[1], batch["labels"].shape[1]
    counted_forward, counted_step = counted_flops(model, batch)
    analytic = analytic_flops(config, 1, source, target)
    return {"analytic_forward": analytic["forward"], "counted_forward": counted_forward,
            "analytic_train_step": analytic["train_step"], "counted_train_step": counted_step,
            "relative_difference": (counted_step - analytic["train_step"]) / analytic["train_step"],
            "analytic_parts_forward": {k: v for k, v in analytic.items() if k not in ("forward", "train_step")}}
