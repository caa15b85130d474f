"""Per-row randomness for pretraining's collators: each row draws from its own key, (seed, its "idx").

A row's span mask, prefix split and UL2 denoiser are then the same whichever rows share its batch,
so a run resumed under another split of the global batch (or on other workers or processes)
re-creates exactly the masks of an uninterrupted one. The draws are counter-based (SplitMix64's
output over key + counter) and vectorised over the rows, where a numpy Generator per row would
cost a Python call each. collators.py, denoisers.py and span_masks.py draw from here; this
module imports nothing from the project.
"""
from __future__ import annotations

import os

import numpy as np
import torch

# One stream per use, so that a row's draws for one purpose never reuse another's.
DENOISER, PREFIX_SPLIT, NOISE_CUTS, KEPT_CUTS = 1, 2, 3, 4
_GOLDEN, _STREAM = np.uint64(0x9E3779B97F4A7C15), 0xD1B54A32D192ED03  # SplitMix64's increment; odd


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, in place on a uint64 array: a bijection that scatters nearby inputs."""
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z ^= z >> np.uint64(shift)
        z *= np.uint64(factor)
    z ^= z >> np.uint64(31)
    return z


def row_keys(seed: int, idx) -> np.ndarray:
    """One uint64 key per row id in `idx`: distinct ids give distinct keys, and other seeds other keys."""
    base = _mix(np.array([int(seed) % 2 ** 64], np.uint64) + _GOLDEN)
    return _mix(_mix(np.asarray(idx, dtype=np.int64).reshape(-1).view(np.uint64) ^ base))


def keys_for(rng, rows: int) -> np.ndarray:
    """`rng` itself when it is `rows` uint64 row keys, else `rows` keys drawn from `rng`, a numpy Generator."""
    keys = rng.integers(0, 2 ** 64, rows, np.uint64) if isinstance(rng, np.random.Generator) else np.asarray(rng)
    if keys.dtype != np.uint64 or keys.shape != (rows,):
        raise ValueError(f"expected a numpy Generator or {rows} uint64 row keys, got {keys.dtype} {keys.shape}")
    return keys


def stream(keys: np.ndarray, purpose: int) -> np.ndarray:
    """The rows' keys for one purpose (DENOISER, PREFIX_SPLIT, ...), independent of other purposes'."""
    return _mix(keys ^ np.uint64(purpose * _STREAM % 2 ** 64))


def uniforms(keys: np.ndarray, counters) -> np.ndarray:
    """Floats in [0, 1), 53 random bits each: draw number counters[i] of the row whose key is keys[i]
    (broadcast together); the same (key, counter) always gives the same number."""
    steps = np.atleast_1d(np.asarray(counters, dtype=np.uint64)) + np.uint64(1)  # 1-d: numpy scalars warn on wrap
    return (_mix(keys + steps * _GOLDEN) >> np.uint64(11)) * 2.0 ** -53


class RowRandomness:
    """The key each row of a batch draws its randomness from (row_keys).

    With "idx" on every example, a row's key is a pure function of (seed, its idx): a resumed run
    re-creates exactly the masks an uninterrupted run saw, whichever micro-batch, data-loader worker
    or process the row lands in, and rows with other idx values draw independently of it.

    Without "idx", the keys come from a stream per (process rank, worker), the best we can do. It
    is created on first use inside the worker, never in __init__: the collator is built before
    DataLoader forks its workers, and a generator made then would be copied into every worker,
    which would all emit identical masks. Keying it on the pid also recreates it if the main
    process used the collator before forking.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self._fallback: tuple[tuple[int, int], np.random.Generator] | None = None

    def __call__(self, examples: list[dict]) -> np.ndarray:
        with_idx = sum("idx" in ex for ex in examples)
        if with_idx == len(examples):
            return row_keys(self.seed, [int(ex["idx"]) for ex in examples])
        if with_idx:
            raise ValueError(f'{with_idx} of {len(examples)} examples carry "idx"; give it to all or none')
        info = torch.utils.data.get_worker_info()
        worker_id = -1 if info is None else info.id
        key = (os.getpid(), worker_id)
        if self._fallback is None or self._fallback[0] != key:
            rank = int(os.environ.get("RANK", 0))
            # SeedSequence takes non-negative entropy only, so the main process (-1) maps to 0.
            self._fallback = (key, np.random.default_rng(np.random.SeedSequence([self.seed, rank, worker_id + 1])))
        return keys_for(self._fallback[1], len(examples))
