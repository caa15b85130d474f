"""A model's weights by component (embeddings, encoder, decoder, a prompt, other): freezing whole
components (`--freeze_encoder`, `--freeze_decoder`, `--freeze_embeddings`) and the table of
parameters a run prints when it starts."""
from __future__ import annotations

from t5_training.errors import UsageError


def _components(model) -> dict[str, list]:
    """Parameters by component: embeddings (shared and, when untied, the output layer), encoder, decoder.

    The shared embedding is listed once, under embeddings, although the encoder and the decoder
    (and a tied output layer) all use it.
    """
    embeddings = {id(model.get_input_embeddings().weight)}
    output = model.get_output_embeddings()
    if output is not None:
        embeddings.add(id(output.weight))
    parts = {"embeddings": [], "encoder": [], "decoder": [], "prompt": [], "other": []}
    for name, param in model.named_parameters():  # each weight once, under the first name that holds it
        # A peft wrapper (t5_training.adapters) puts the base model's names under base_model(.model).
        name = name.removeprefix("base_model.").removeprefix("model.")
        if id(param) in embeddings:
            part = "embeddings"
        else:
            part = next((p for p in ("encoder", "decoder") if name.startswith(f"{p}.")), "other")
            part = "prompt" if name.startswith("prompt_encoder.") else part
        parts[part].append(param)
    return parts


def freeze(model, *, encoder: bool = False, decoder: bool = False, embeddings: bool = False) -> None:
    """Turns off gradients for whole components (see `_components`); the optimizer then skips them."""
    parts = _components(model)
    for part, frozen in (("encoder", encoder), ("decoder", decoder), ("embeddings", embeddings)):
        for param in parts[part] if frozen else ():
            param.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise UsageError("every weight is frozen, so there is nothing to train: drop one of --freeze_encoder, "
                         "--freeze_decoder, --freeze_embeddings")


def model_summary(model) -> str:
    """Parameters and bytes per component, total and trainable: printed when a run starts."""
    rows = []
    totals = [0, 0, 0]
    for part, params in _components(model).items():
        if not params:
            continue
        count = sum(p.numel() for p in params)
        trainable = sum(p.numel() for p in params if p.requires_grad)
        size = sum(p.numel() * p.element_size() for p in params)
        totals = [totals[0] + count, totals[1] + trainable, totals[2] + size]
        rows.append((part, count, trainable, size))
    rows.append(("total", *totals))
    lines = [f"{'component':<11}{'params':>14}{'trainable':>14}{'MiB':>10}"]
    lines += [f"{part:<11}{count:>14,}{trainable:>14,}{size / 2**20:>10.1f}" for part, count, trainable, size in rows]
    lines.append(f"trainable: {totals[1]:,} of {totals[0]:,} parameters ({100 * totals[1] / max(totals[0], 1):.2f}%)")
    return "\n".join(lines)
