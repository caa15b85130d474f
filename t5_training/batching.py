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


def compile_widths(max_length: int) -> tuple[int, ...]:
    """The widths training batches are padded to under --torch_compile on a GPU (see
    `compiled_widths`): powers of two from 8, then `max_length` rounded up to 8. A compiled model
    runs one static graph per batch shape, so the shapes must be few; doubling widths pad a batch
    by under half its longest row (a quarter on average) and give log2(max_length / 8) + 1 widths:
    7 up to 512."""
    widths = [GPU_PAD_MULTIPLE]
    while widths[-1] < max_length:
        widths.append(min(2 * widths[-1], -(-max_length // GPU_PAD_MULTIPLE) * GPU_PAD_MULTIPLE))
    return tuple(widths)


def compiled_widths(config) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The source and target widths training batches are padded to: under --torch_compile on a
    GPU, `compile_widths` of the max lengths; None otherwise (the batch's longest row).

    Only on a GPU: static graphs are the fastest kernels there and what CUDA graphs
    (--torch_compile_mode reduce-overhead) need, and its batches are padded to 8 anyway. On a CPU
    padding costs its full share of compute: on SST-2 (t5-tiny, batch 32) widths ran slower than
    eager, most of it the LM head over 8 target positions instead of 2 or 3, while one graph for
    symbolic lengths ran faster (benchmarks/compile_speed.py, docs/results/performance.md#compiling).
    """
    if not (config.torch_compile and runs_on_cuda()):
        return None
    return compile_widths(config.max_source_length), compile_widths(config.max_target_length)


def compiled_shape_count(config) -> int | None:
    """How many training batch shapes fine-tuning can see where `compiled_widths` pads them: every
    pair of widths, at the full batch and at an epoch's last, smaller one. None where shapes vary."""
    widths = compiled_widths(config)
    return None if widths is None else len(widths[0]) * len(widths[1]) * 2


def train_collator(config, pad_token_id: int, decoder_start_token_id: int) -> Seq2SeqCollator:
    """The training batches' collator: to the longest row, or to `compiled_widths` where they apply."""
    return Seq2SeqCollator(pad_token_id, decoder_start_token_id, pad_multiple(), *(compiled_widths(config) or ()))


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: start token, then labels without the last, -100 as pad."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


@dataclass(frozen=True)
class Seq2SeqCollator:
    """Pads a list of tokenized rows to the batch's longest row, rounded up to `pad_to_multiple_of`,
    or, where `source_widths` / `target_widths` are given, to the narrowest of them that fits it.

    Padding positions get `pad_token_id` in inputs and -100 in labels, so the loss ignores them.
    Fields other than token ids (text kept for reports) are dropped; `idx` is kept if present.
    """

    pad_token_id: int
    decoder_start_token_id: int
    pad_to_multiple_of: int = 1
    source_widths: tuple[int, ...] = ()
    target_widths: tuple[int, ...] = ()

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        input_ids = _pad([r["input_ids"] for r in rows], self.pad_token_id, self.pad_to_multiple_of,
                         self.source_widths)
        labels = _pad([r["labels"] for r in rows], -100, self.pad_to_multiple_of, self.target_widths)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_token_id).long(),
            "labels": labels,
            "decoder_input_ids": shift_right(labels, self.decoder_start_token_id, self.pad_token_id),
        }
        if "idx" in rows[0]:
            batch["idx"] = torch.tensor([r["idx"] for r in rows])
        return batch


def _pad(sequences: list[list[int]], value: int, multiple: int, widths: tuple[int, ...]) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    # Rows are truncated to the widths' last, so one fits; a longer row keeps its own width.
    width = next((w for w in widths if w >= longest), -(-longest // multiple) * multiple)
    out = np.full((len(sequences), width), value, dtype=np.int64)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = s
    return torch.from_numpy(out)
