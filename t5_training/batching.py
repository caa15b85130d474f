"""Batches of tokenized rows for teacher forcing: padding to the longest row (rounded up on a GPU),
the padding masked out of the loss, and the decoder's inputs shifted from the labels."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from t5_training.device import runs_on_cuda

# Batches are padded to their longest row, rounded up to this multiple in a GPU run only (not a
# CPU run on a GPU host; device.runs_on_cuda): tensor cores tile by 8, and fewer distinct shapes
# mean fewer kernel autotunes and compiled graphs.
# On a CPU the rounding is pure waste: a 2-token SST-2 target would cost 8 decoder positions.
GPU_PAD_MULTIPLE = 8


def pad_multiple() -> int:
    """The multiple batch widths are rounded up to on this process's device; see GPU_PAD_MULTIPLE."""
    return GPU_PAD_MULTIPLE if runs_on_cuda() else 1


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: start token, then labels without the last, -100 as pad."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


@dataclass(frozen=True)
class Seq2SeqCollator:
    """Pads a list of tokenized rows to the batch's longest row, rounded up to `pad_to_multiple_of`.

    Padding positions get `pad_token_id` in inputs and -100 in labels, so the loss ignores them.
    Fields other than token ids (text kept for reports) are dropped; `idx` is kept if present.
    """

    pad_token_id: int
    decoder_start_token_id: int
    pad_to_multiple_of: int = 1

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        input_ids = _pad([r["input_ids"] for r in rows], self.pad_token_id, self.pad_to_multiple_of)
        labels = _pad([r["labels"] for r in rows], -100, self.pad_to_multiple_of)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_token_id).long(),
            "labels": labels,
            "decoder_input_ids": shift_right(labels, self.decoder_start_token_id, self.pad_token_id),
        }
        if "idx" in rows[0]:
            batch["idx"] = torch.tensor([r["idx"] for r in rows])
        return batch


def _pad(sequences: list[list[int]], value: int, multiple: int) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    width = -(-longest // multiple) * multiple
    out = np.full((len(sequences), width), value, dtype=np.int64)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = s
    return torch.from_numpy(out)
