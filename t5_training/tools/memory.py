"""How much memory one training step of a T5 model needs per device, before you launch it.

    python -m t5_training.memory --config_name configs/t5-small.json --batch_size 8 \
        --source_length 512 --target_length 114 --precision bf16 --optim adafactor
    python -m t5_training.memory --config_name configs/t5-v1_1-base.json --batch_size 32 --source_length 568 \
        --target_length 114 --precision bf16 --zero_stage 2 --world_size 8 --gradient_checkpointing --json

The model is built on the `meta` device (no memory, exact parameter counts; tied weights count
once). Bytes per parameter, as accelerate and DeepSpeed hold them:

    weights      4 (fp32; bf16/fp16 autocast keeps fp32 weights); 2 under DeepSpeed 16-bit (ZeRO >= 1)
    gradients    one per trainable parameter, in the weights' dtype; DDP (world_size > 1, ZeRO 0)
                 adds its fp32 communication buckets, a second copy
    optimizer    AdamW and adamw_scale 8 (two fp32 moments); T5's Adafactor (no first moment) 4 per
                 row + column of tensors whose two largest dims are >= 128, 4 per element of the
                 rest; adafactor_hf factors every matrix; DeepSpeed 16-bit adds a 4-byte fp32
                 master copy, and hands the optimizer flat 1-D partitions, so Adafactor's second
                 moment is no longer factored under ZeRO
    ZeRO         stage 1 divides the optimizer state by world_size, 2 also the gradients (plus one
                 d_model**2 reduce bucket), 3 also the weights (plus the largest layer, gathered)

Activations are what autograd saves for backward, followed op by op through transformers'
modeling_t5.py (`t5_training.tools.activation_memory`, which gives the bytes per token of each layer),
with the peak followed through the backward pass rather than summed.

The optimizer step holds weights, gradients, state and its temporaries: none for the fused AdamW
that optim.py builds; on a GPU, one copy of the largest chunk of tensors that T5's Adafactor and
adamw_scale update together (foreach.foreach_chunks: 64 MiB, or the largest tensor), on a CPU,
where they step one tensor at a time, one copy of the largest tensor; two copies of the largest
tensor for HF's Adafactor; DeepSpeed's unfused client AdamW copies its
partition (foreach on a GPU once, per tensor on a CPU twice). Not counted: the
CUDA context and allocator caching (about 0.5-1 GiB more in nvidia-smi), and the data loader.
With `--peft` (fine_tune_t5.py's adapter flags) every base weight is frozen and the adapter's own
parameters train; `adapter_memory` puts the adapter on the meta model with peft and traces its layers.
`benchmarks/memory_estimator.py` checks the total against measured memory.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch

from t5_training import adapters, model_sources, modeling
from t5_training.tools import activation_memory, adapter_memory, autograd_tape, optimizer_memory
from t5_training.config import OPTIMIZERS, parse_config
from t5_training.errors import UsageError, first_line, run_cli

PRECISIONS = ("fp32", "bf16", "fp16")
FROZEN = ("encoder", "decoder", "embeddings")


@dataclass(frozen=True)
class MemoryConfig(adapters.AdapterConfig):
    """Flags of `python -m t5_training.memory`: the model, the batch and how it is trained, with
    fine_tune_t5.py's --peft flags for an adapter."""

    config_name: str = field(default="configs/t5-small.json", metadata={"help": "Model config: JSON file, "
                                                                              "folder or hub name."})
    batch_size: int = field(default=8, metadata={"help": "Per device (per_device_train_batch_size)."})
    source_length: int = 512
    target_length: int = 114
    precision: Literal[PRECISIONS] = field(default="fp32", metadata={"help": "bf16/fp16: autocast, as "
                                                                             "--mixed_precision does."})
    optim: Literal[OPTIMIZERS] = "adamw_torch"
    zero_stage: int = field(default=0, metadata={"help": "DeepSpeed ZeRO stage, 0 (none) to 3."})
    world_size: int = field(default=1, metadata={"help": "Processes (GPUs) the run is spread over."})
    gradient_checkpointing: bool = False
    freeze_encoder: bool = False
    freeze_decoder: bool = False
    freeze_embeddings: bool = field(default=False, metadata={"help": "The shared token embedding (and an "
                                                                     "untied lm_head)."})
    device: Literal["cuda", "cpu"] = field(default="cuda", metadata={"help": "Kernels differ: dropout masks, "
                                                                             "attention."})
    padding: bool = field(default=True, metadata={"help": "Batches have padding (fine-tuning); false for packed "
                                                          "pretraining batches."})
    dropout_rate: float | None = field(default=None, metadata={"help": "Overrides the config's dropout."})
    vocab_size: int | None = field(default=None, metadata={"help": "Overrides the config's (the scripts size "
                                                                   "it to the tokenizer)."})
    json: bool = field(default=False, metadata={"help": "Print a JSON object instead of the table."})

    def __post_init__(self):
        _check(self.batch_size, self.source_length, self.target_length, self.zero_stage, self.world_size,
               self.frozen)
        if self.dropout_rate is not None and not 0.0 <= self.dropout_rate < 1.0:
            raise UsageError(f"--dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise UsageError(f"--vocab_size must be at least 1, got {self.vocab_size}")
        super().__post_init__()

    @property
    def frozen(self) -> tuple[str, ...]:
        return tuple(part for part in FROZEN if getattr(self, f"freeze_{part}"))


def _check(batch_size, source_length, target_length, zero_stage, world_size, frozen) -> None:
    for flag, value in (("batch_size", batch_size), ("source_length", source_length),
                        ("target_length", target_length), ("world_size", world_size)):
        if value < 1:
            raise UsageError(f"--{flag} must be at least 1, got {value}")
    if zero_stage not in (0, 1, 2, 3):
        raise UsageError(f"--zero_stage must be 0, 1, 2 or 3, got {zero_stage}")
    if zero_stage and world_size == 1:
        raise UsageError(f"--zero_stage {zero_stage} shards over processes, but --world_size is 1; "
                         "pass --world_size N (the number of GPUs) or --zero_stage 0")
    if set(frozen) >= set(FROZEN):
        raise UsageError("nothing to train: every parameter is frozen; drop one of --freeze_encoder, "
                         "--freeze_decoder, --freeze_embeddings")
    unknown = set(frozen) - set(FROZEN)
    if unknown:
        raise UsageError(f"cannot freeze {sorted(unknown)}; choose from {list(FROZEN)}")


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted bytes per device. Each component is its own maximum during the step; `total` is the
    peak of their sum, reached at `peak_at` (less than the sum: gradients appear as activations go)."""

    parameters: int
    trainable_parameters: int
    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    total: int
    peak_at: str
    # What autograd keeps for backward by the end of the forward (the bulk of `activations`): the
    # figure benchmarks/memory_estimator.py checks against a census of what a device really keeps.
    saved_for_backward: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def part_of(name: str) -> str:
    """The component a parameter belongs to: embeddings, encoder or decoder (as --freeze_* names them)."""
    return "embeddings" if name in ("shared.weight", "lm_head.weight") else name.split(".")[0]


def parameter_shapes(model_config) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape (tied weights once), from a model built on the meta device as the
    scripts build it (T5 v1.1's output layer apart from the embedding)."""
    with torch.device("meta"):
        model = modeling.fresh_model(model_config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def estimate(model_config, *, batch_size: int, source_length: int, target_length: int, precision: str = "fp32",
             optim: str = "adamw_torch", zero_stage: int = 0, world_size: int = 1,
             gradient_checkpointing: bool = False, frozen: Sequence[str] = (), device: str = "cuda",
             padding: bool = True, adapter: adapter_memory.AdapterLayers | None = None) -> MemoryEstimate:
    """Peak memory per device of one training step (forward, backward, optimizer step) of a T5
    model shaped by `model_config` (a transformers T5Config), as the module docstring describes.
    With `adapter` (adapter_memory.describe) only the adapter trains, and its layers are traced."""
    _check(batch_size, source_length, target_length, zero_stage, world_size, frozen)
    if precision not in PRECISIONS or optim not in OPTIMIZERS or device not in ("cuda", "cpu"):
        raise UsageError(f"precision, optim and device must be one of {PRECISIONS}, {OPTIMIZERS}, "
                         f"('cuda', 'cpu'); got {precision!r}, {optim!r}, {device!r}")
    pure16 = zero_stage > 0 and precision != "fp32"  # DeepSpeed runs the model itself in 16-bit
    weight_bytes = 2 if pure16 else 4
    # An adapter freezes every base weight and trains its own.
    trainable = {part: adapter is None and part not in frozen for part in FROZEN}
    tape, stages = activation_memory.trace(
        model_config, batch=batch_size, source=source_length, target=target_length, trainable=trainable,
        device=device, precision=precision, pure16=pure16, checkpointing=gradient_checkpointing, padding=padding,
        adapters=adapter)
    shapes = adapter.shapes if adapter else parameter_shapes(model_config)
    tied = "lm_head.weight" not in shapes
    stage_of = {name: activation_memory.gradient_stage(name, stages, tied) for name in shapes}
    learn = [name for name in shapes if (name in adapter.trainable if adapter else trainable[part_of(name)])]
    n_params, n_learn = sum(math.prod(s) for s in shapes.values()), sum(math.prod(shapes[n]) for n in learn)

    shard = lambda n, stage: -(-n // world_size) if zero_stage >= stage else n  # noqa: E731
    weights = shard(n_params * weight_bytes, 3)
    if zero_stage == 3:  # the largest layer, gathered whole while it runs
        per_stage = collections.Counter()
        for name, shape in shapes.items():
            per_stage[stage_of[name]] += math.prod(shape)
        weights += max(per_stage.values()) * weight_bytes
    grad_extra = 0
    if zero_stage == 0 and world_size > 1:
        grad_extra = n_learn * 4  # DDP's communication buckets, a second fp32 copy
    elif zero_stage >= 2:
        grad_extra = min(n_learn, model_config.d_model ** 2) * weight_bytes  # the reduce bucket
    gradients = shard(n_learn * weight_bytes, 2) + grad_extra
    optimizer_state = shard(optimizer_memory.state_bytes([shapes[n] for n in learn], optim, flat=zero_stage > 0)
                            + (4 * n_learn if pure16 else 0), 1)  # DeepSpeed's fp32 master weights

    # DeepSpeed hands the optimizer flat partitions: one tensor, one chunk.
    largest = shard(n_learn, 1) if zero_stage else max(math.prod(shapes[n]) for n in learn)
    chunk = shard(n_learn, 1) if zero_stage else optimizer_memory.largest_chunk(shapes, learn)
    step_temporaries = optimizer_memory.step_temporaries(optim, device, zero_stage, largest, chunk, shard(n_learn, 1))
    if pure16:
        step_temporaries += 4 * shard(n_learn, 1)  # the fp32 gradient partition

    grads_from = _gradients_alive(len(stages), {name: shapes[name] for name in learn}, stage_of, weight_bytes)
    profile = autograd_tape.activation_profile(tape, stages)
    backward = [(activations + shard(grads_from[s], 2) + grad_extra, s) for s, activations in profile]
    peak, s = max(backward)
    step = gradients + step_temporaries
    return MemoryEstimate(
        parameters=n_params, trainable_parameters=n_learn, weights=weights, gradients=gradients,
        optimizer_state=optimizer_state, activations=max(activations for _, activations in profile),
        total=weights + optimizer_state + max(peak, step),
        peak_at=f"backward, {stages[s]}" if peak >= step else "optimizer step",
        saved_for_backward=sum(tape.bytes[key] for key in tape.saved_by()))


def _gradients_alive(n_stages: int, learned: dict[str, Sequence[int]], stage_of: dict[str, int],
                     weight_bytes: int) -> list[int]:
    """Bytes of parameter gradients that exist while backward runs each stage: a stage's gradients
    appear as backward enters it (the stage of a parameter's last use) and stay to the step."""
    grads_from = [0] * (n_stages + 1)
    for name, shape in learned.items():
        grads_from[stage_of[name]] += math.prod(shape) * weight_bytes
    for s in reversed(range(n_stages)):
        grads_from[s] += grads_from[s + 1]
    return grads_from


# --- the command ---------------------------------------------------------------------------------

def load_model_config(name: str, dropout_rate: float | None = None, vocab_size: int | None = None):
    """A T5 config from a JSON file, a model folder or a hub name, with the overrides applied."""
    from transformers import AutoConfig

    overrides = {key: value for key, value in (("dropout_rate", dropout_rate), ("vocab_size", vocab_size))
                 if value is not None}
    try:
        config = AutoConfig.from_pretrained(model_sources.resolve_config_name(name), **overrides)
    except (OSError, ValueError) as err:
        raise UsageError(f"could not load model config {name!r} ({first_line(err)}); pass a config "
                         "JSON such as configs/t5-small.json, a model folder or a hub name") from None
    if config.model_type not in ("t5", "mt5"):
        raise UsageError(f"{name} is a {config.model_type!r} model; the estimator follows T5's code, so pass a "
                         "T5 or mT5 config such as configs/t5-small.json")
    return config


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def format_estimate(config: MemoryConfig, result: MemoryEstimate, adapter=None) -> str:
    """The estimate as a table, with what each row holds."""
    from t5_training.reporting import format_table

    pure16 = config.zero_stage > 0 and config.precision != "fp32"
    weight_dtype = "bf16/fp16 (DeepSpeed)" if pure16 else "fp32"
    optimizer = {"adamw_torch": "AdamW: 2 fp32 moments", "adamw_scale": "AdamW (RMS-scaled): 2 fp32 moments",
                 "adafactor": "T5's Adafactor: 2nd moment factored where both dims >= 128",
                 "adafactor_hf": "HF's Adafactor: every matrix's 2nd moment factored"}[config.optim]
    if config.optim.startswith("adafactor") and config.zero_stage:
        optimizer = "Adafactor on flat ZeRO partitions: full 2nd moment"
    zero = f", ZeRO-{config.zero_stage} over {config.world_size}" if config.zero_stage else (
        f", DDP over {config.world_size}" if config.world_size > 1 else "")
    rows = [
        {"component": "weights", "per device": _size(result.weights), "holds": f"{weight_dtype}{zero}"},
        {"component": "gradients", "per device": _size(result.gradients),
         "holds": f"{weight_dtype}, trainable parameters" + (" + DDP buckets" if "DDP" in zero else "")},
        {"component": "optimizer state", "per device": _size(result.optimizer_state),
         "holds": optimizer + (" + fp32 master weights" if pure16 else "")},
        {"component": "activations", "per device": _size(result.activations),
         "holds": "saved for backward + backward workspace, incl. fp32 log-probs for the loss"
                  + (" and 16-bit weight copies" if config.precision != "fp32" and not pure16 else "")},
        {"component": "total (peak)", "per device": _size(result.total), "holds": f"at {result.peak_at}"},
    ]
    millions = (f"{_count(result.parameters)} parameters ({_count(result.trainable_parameters)} trainable"
                + (f": {adapter.describe_method()})" if adapter else ")"))
    head = (f"{config.config_name}: {millions}; batch {config.batch_size}, "
            f"{config.source_length} -> {config.target_length} tokens, {config.precision}, {config.optim}{zero}"
            f"{', gradient checkpointing' if config.gradient_checkpointing else ''}, {config.device}")
    note = ("The total is the peak of the sum through the step (gradients appear as activations are freed). "
            + ("Measured on a GPU (an H200, t5-small and t5-base), the peak of allocated memory was within 2% "
               "of this estimate (docs/results/performance.md); allow 0.5-1 GiB more for the CUDA context."
               if config.device == "cuda" else ""))
    return f"{head}\n{format_table(rows)}\n{note.strip()}"


def main(argv: Sequence[str] | None = None) -> MemoryEstimate:
    config = parse_config(MemoryConfig, argv)
    model_config = load_model_config(config.config_name, config.dropout_rate, config.vocab_size)
    adapter = adapter_memory.describe(model_config, config) if adapters.in_use(config) else None
    result = estimate(model_config, batch_size=config.batch_size, source_length=config.source_length,
                      target_length=config.target_length, precision=config.precision, optim=config.optim,
                      zero_stage=config.zero_stage, world_size=config.world_size,
                      gradient_checkpointing=config.gradient_checkpointing, frozen=config.frozen,
                      device=config.device, padding=config.padding, adapter=adapter)
    if config.json:
        print(json.dumps({"inputs": dataclasses.asdict(config), "bytes": result.to_dict()}, indent=2))
    else:
        print(format_estimate(config, result, adapter))
    return result


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
