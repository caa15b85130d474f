"""Evaluation by teacher forcing, pretraining's: the held-out target tokens' mean loss and accuracy.

Fine-tuning evaluates by decoding (t5_training/evaluation.py); a pretraining objective's targets
are the corrupted spans themselves, scored token by token with the decoder fed the true ones.
"""
from __future__ import annotations

from typing import Sequence

import torch

from t5_training.losses import row_cross_entropy


def row_stats(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: summed target-token loss, number of target tokens, and tokens predicted right."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=batch["decoder_input_ids"]).logits
    labels = batch["labels"]
    loss, tokens = row_cross_entropy(logits, labels)
    correct = ((logits.argmax(dim=-1) == labels) & (labels != -100)).sum(dim=1)
    return loss, tokens, correct


def make_evaluator(accelerator, loader, groups: Sequence[str] = (), group_key: str = "denoiser_ids"):
    """`evaluate(model) -> {"loss", "accuracy"}`: mean target-token loss and the percentage of
    target tokens (sentinels included) predicted right, over a fixed evaluation set.

    With `groups` (a mixture's denoiser names), each row's `group_key` is its index into them,
    and the results add "<group>/loss": the loss over that group's target tokens, for each group
    with rows in the set. Its sums are gathered from every process as the totals are.
    """

    def evaluate(model) -> dict:
        totals = torch.zeros(3, dtype=torch.float64)
        per_group = torch.zeros(len(groups), 2, dtype=torch.float64)  # summed loss, target tokens
        with torch.no_grad(), accelerator.autocast():
            for batch in loader:
                stats = row_stats(model, batch)
                if groups:
                    *stats, ids = accelerator.gather_for_metrics((*stats, batch[group_key]))
                    per_group.index_add_(0, ids.cpu(), torch.stack(stats[:2], dim=1).double().cpu())
                else:
                    stats = accelerator.gather_for_metrics(stats)
                totals += torch.stack([s.sum().double().cpu() for s in stats])
        loss, tokens, correct = totals.tolist()
        results = {"loss": loss / max(tokens, 1), "accuracy": 100 * correct / max(tokens, 1)}
        results.update({f"{name}/loss": summed / count for name, (summed, count) in zip(groups, per_group.tolist())
                        if count})
        return results

    return evaluate
