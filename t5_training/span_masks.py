"""T5 noise masks for rows of different lengths in one vectorised call: the span rows of a mixture
of denoisers (denoisers.py), each with its own length, noise count and span count.

collators.random_spans_noise_mask serves rows that share one shape; here rows differ. As
there, each row draws from its own key (t5_training.row_keys), so its mask is the same
whichever rows share its batch.
"""
from __future__ import annotations

import numpy as np

from t5_training.collators import toggled
from t5_training.row_keys import KEPT_CUTS, NOISE_CUTS, keys_for, stream, uniforms


def _ragged_cuts(keys: np.ndarray, items: np.ndarray, segments: np.ndarray) -> np.ndarray:
    """Flat, row by row and sorted: for row r, segments[r] - 1 distinct cut points uniform among the
    items[r] - 1 gaps between its items (cut p: a segment ends after item p), drawn from keys[r] alone."""
    gaps, cuts = items - 1, segments - 1
    width = max(int(gaps.max()), 1)
    # Where most gaps are cut, draw the uncut ones instead: never more than half a row to draw.
    flip = cuts > gaps // 2
    wanted = np.where(flip, gaps - cuts, cuts)
    chosen = np.zeros((len(gaps), width), dtype=bool)
    # Sequential draws: each row draws gaps at random and takes every one it has not taken yet, until
    # it has as many as it wants. All gaps are treated alike, so every set of the wanted size is
    # equally likely. At UL2's densities that is a fraction of the draws of a shuffle of all gaps
    # (28 cuts among 480 gaps for R). Draws are flat, by row, as many as each row still misses; a
    # row's i-th draw is the i-th number of its key, so the rows beside it change nothing.
    draws, missing, drawn, first_round = wanted, wanted, np.zeros(len(gaps), np.int64), True
    while missing.any():
        row, starts = np.repeat(np.arange(len(gaps)), draws), np.cumsum(draws) - draws
        counters = drawn[row] + np.arange(len(row)) - np.repeat(starts, draws)
        drawn += draws
        # floor(u * n) with 53-bit uniforms: uniform to within 2^-53.
        picks = (uniforms(keys[row], counters) * gaps[row]).astype(np.int64) + row * width
        if not first_round:
            # Past the first round rows draw twice what they miss, and take the new gaps in the
            # order drawn until they have enough: the draws after that are never looked at.
            new = np.zeros(len(picks), dtype=bool)
            new[np.unique(picks, return_index=True)[1]] = True  # first draw of each gap
            new &= ~chosen.reshape(-1)[picks]
            taken = np.concatenate([[0], np.cumsum(new)])  # new gaps among the first i draws
            rank = taken[1:] - np.repeat(taken[starts], draws)  # ... of the draw's row
            picks = picks[new & (rank <= missing[row])]
        chosen.reshape(-1)[picks] = True  # in the first round, exactly the draws: never more than wanted
        missing, first_round = wanted - np.count_nonzero(chosen, axis=1), False
        draws = np.where(missing > 0, 2 * missing + 8, 0)
    if flip.any():  # rare: UL2's denoisers never cut more than half the gaps
        chosen[flip] ^= np.arange(width) < gaps[flip, None]
    return np.flatnonzero(chosen) % width


def random_spans_noise_masks(rng, lengths: np.ndarray, num_noise: np.ndarray, num_spans: np.ndarray) -> np.ndarray:
    """T5 noise masks of rows of different lengths at once, flat: row r's lengths[r] entries follow
    row r - 1's, with num_noise[r] noise tokens in num_spans[r] spans, every such mask equally likely,
    kept text first and noise last (collators.random_spans_noise_mask, row by row). `rng`: one
    uint64 key per row (t5_training.row_keys), which alone decides the row's mask, or a numpy Generator."""
    keys = keys_for(rng, len(lengths))
    kept = lengths - num_noise
    cuts = _ragged_cuts(np.concatenate([stream(keys, NOISE_CUTS), stream(keys, KEPT_CUTS)]),
                        np.concatenate([num_noise, kept]), np.concatenate([num_spans, num_spans]))
    noise_cuts, kept_cuts = np.split(cuts + 1, 2)  # aligned: the i-th cut of row r in both
    # Row r's kept bounds kb[1..S] = its kept cuts then K, noise bounds nb[0..S-1] = 0 then its noise
    # cuts; noise span j covers [kb[j+1] + nb[j], kb[j+1] + nb[j+1]), the last one to the row's end.
    is_last = np.zeros(int(num_spans.sum()), dtype=bool)
    is_last[np.cumsum(num_spans) - 1] = True
    is_first = np.roll(is_last, 1)
    kept_bounds = np.empty(len(is_last), np.int64)
    kept_bounds[is_last], kept_bounds[~is_last] = kept, kept_cuts
    noise_bounds = np.zeros_like(kept_bounds)
    noise_bounds[~is_first] = noise_cuts
    row_start = np.repeat(np.cumsum(lengths) - lengths, num_spans)
    flips = np.zeros((1, int(lengths.sum()) + 1), dtype=bool)
    flips[0, row_start + kept_bounds + noise_bounds] = True  # noise spans start,
    flips[0, row_start[~is_last] + kept_cuts + noise_cuts] = True  # end,
    flips[0, np.cumsum(lengths)] = True  # and the last ends with its row
    return toggled(flips)[0, :-1]
