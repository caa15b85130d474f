"""Cross-entropy over target tokens, the one definition training and evaluation share.

Both compute in fp32 (logits may be bf16 under mixed precision) and ignore the -100 of padded
labels. Training needs one sum per micro-batch, which one fused reduction gives without a
per-row tensor; evaluation needs the loss of each row (to weight rows correctly across
processes and to pick a label candidate), so it reduces per row.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # the label of a padded target position


def token_cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed (not averaged) cross entropy over non-padding target tokens, computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1), ignore_index=IGNORE,
                           reduction="sum")


def row_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed cross entropy of its target tokens (fp32) and how many there are."""
    loss = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE, reduction="none").sum(dim=1)
    return loss, (labels != IGNORE).sum(dim=1)


def forward_loss_sum(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """One teacher-forced forward pass over a batch and its summed target-token loss."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=batch["decoder_input_ids"]).logits
    return token_cross_entropy_sum(logits, batch["labels"])
