"""The order in which training rows are visited: a seeded shuffle, or a shuffle grouped by length.

Both orders are pure functions of (seed, epoch). Resuming needs the order of a past epoch again,
so nothing about the order may depend on how far a previous run got; and both draw from their
own generator, leaving the global RNG (dropout) untouched, so an interrupted run sees exactly
the batches an uninterrupted one would.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

# Rows are sorted by length inside windows of this many batches. Larger windows pad less but
# make a batch's neighbours more predictable; 50 is what HF's LengthGroupedSampler uses.
MEGABATCH_BATCHES = 50


def epoch_generator(seed: int, epoch: int, *stream: int) -> torch.Generator:
    """A generator for one epoch's draws; `stream` numbers further independent streams (a mixture's tasks)."""
    # Mix seed and epoch so that seed 43 at epoch 0 is not seed 42 at epoch 1.
    mixed = np.random.SeedSequence([seed, epoch, *stream]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(mixed))


class EpochShuffleSampler(torch.utils.data.Sampler[int]):
    """A permutation of the dataset that depends only on (seed, epoch)."""

    def __init__(self, length: int, seed: int):
        self.length = length
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.length, generator=epoch_generator(self.seed, self.epoch)).tolist())


class EpochNumberedSampler(EpochShuffleSampler):
    """EpochShuffleSampler's order, each row given as `epoch * length + row`: for a dataset that reads the
    epoch from the number (corpus.EpochChunks), as data-loader workers never see set_epoch."""

    def __iter__(self) -> Iterator[int]:
        offset = self.epoch * self.length
        return (offset + row for row in super().__iter__())


class LengthGroupedSampler(EpochShuffleSampler):
    """A shuffle in which consecutive `batch_size` rows have similar lengths (`--group_by_length`).

    `batch_size` is the global batch (per-device batch x accumulation x processes). The epoch's
    permutation is cut into windows of `MEGABATCH_BATCHES` global batches and each window is
    sorted by length, longest first, so the micro-batches cut from a global batch hold rows of
    similar length and pad little. The windows keep the shuffle random at the scale of the
    epoch, and the order of the global batches inside a window is shuffled too, so the model
    does not see lengths fall steadily. Every row is still visited exactly once per epoch.

    Grouping by the global batch rather than the per-device one makes the order of rows a
    function of (seed, epoch, global batch) alone: a run resumed with another per-device batch,
    accumulation or number of processes, but the same global batch, sees the same rows.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int):
        super().__init__(len(lengths), seed)
        self.lengths = torch.as_tensor(lengths, dtype=torch.int64)
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[int]:
        generator = epoch_generator(self.seed, self.epoch)
        order = torch.randperm(self.length, generator=generator)
        return iter(group_by_length(order, self.lengths, self.batch_size, generator))


def group_by_length(order: torch.Tensor, lengths: torch.Tensor, batch_size: int,
                    generator: torch.Generator) -> list[int]:
    """`order` (row ids) regrouped as LengthGroupedSampler describes: windows of MEGABATCH_BATCHES batches
    of `batch_size` rows, each sorted by `lengths[row]`, longest first, its full batches shuffled."""
    window = batch_size * MEGABATCH_BATCHES
    out = []
    for start in range(0, len(order), window):
        rows = order[start:start + window]
        # A stable sort, so equal lengths keep the shuffled order.
        rows = rows[torch.sort(lengths[rows], descending=True, stable=True).indices]
        batches = list(torch.split(rows, batch_size))
        # The window's short last batch stays last, so batches elsewhere remain full.
        full = batches[:-1] if len(batches[-1]) < batch_size else batches
        shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
        out.extend(shuffled + batches[len(full):])
    return torch.cat(out).tolist() if out else []
