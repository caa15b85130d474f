"""Which linear layers an adapter may adapt, and which LoRA adapts by default (`--lora_target_modules`,
`--ia3_target_modules`)."""
from __future__ import annotations

import torch

from t5_training.errors import UsageError


def _tied_head(model) -> bool:
    """True when the output layer shares its weight with the input embedding (T5 1.0's). Not the
    config's flag: transformers 5 sets tie_word_embeddings on every T5, T5 v1.1's whose output
    layer is its own (a pretrained one, or a fresh one: modeling.untie_output_layer) included."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and head.weight is embedding.weight


def _linear_names(model) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}


def _output_layer_names(model) -> set[str]:
    head = model.get_output_embeddings()
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if module is head}


def default_lora_targets(model) -> list[str]:
    """What LoRA adapts when --lora_target_modules is unset: every linear layer but the output layer
    (T5: q, k, v, o, wi, wo; a gated feed-forward has wi_0 and wi_1). peft's own default for T5, q and
    v alone, left t5-tiny at SST-2's majority class where all six learned (docs/results/peft.md)."""
    return sorted(_linear_names(model) - _output_layer_names(model))


def check_targets(model, flag: str, targets: list[str] | None) -> None:
    """A target that names no linear layer, or a tied output layer, is one line listing the layers it may name."""
    if targets is None:
        return
    linear = _linear_names(model)
    # Merging an update into a tied output layer writes it into the input embedding as well, so
    # the merged export would not compute what the adapter model computes.
    tied = _output_layer_names(model) if _tied_head(model) else set()
    linear -= tied
    clash = sorted(tied & set(targets))
    if clash:
        raise UsageError(f"{flag} names {clash[0]}, this model's output layer, which shares its weight with the input "
                         f"embedding (tied, as in T5), so the merged export would change the embedding too; drop "
                         f"{clash[0]} and name only {', '.join(sorted(linear))} (only an output layer with a weight of "
                         "its own can be adapted)")
    missing = [name for name in targets if name not in linear]
    if missing:
        raise UsageError(f"{flag}: this model has no linear layer named {missing[0]!r}; it has "
                         f"{', '.join(sorted(linear))}")
