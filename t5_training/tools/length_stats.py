"""The numbers of a column of token lengths: percentiles, truncation at a max length, a suggested
max length and a histogram (tools/dataset_stats.py reads the lengths and prints them)."""
from __future__ import annotations

import numpy as np

from t5_training import batching

PERCENTILES = (50, 90, 95, 99)
HISTOGRAM_BINS = 10
# Keeping every row whole costs little when the longest is this short (batches are padded only
# to their own longest row); beyond it, the longest rows are outliers worth cutting.
KEEP_ALL_UP_TO = 128
# A round number that GPU batches are padded to anyway (batching.GPU_PAD_MULTIPLE).
SUGGESTION_MULTIPLE = batching.GPU_PAD_MULTIPLE
SUGGESTION_RULE = (f"the longest row if it has at most {KEEP_ALL_UP_TO} tokens, else p99; "
                   f"rounded up to a multiple of {SUGGESTION_MULTIPLE}")


def length_stats(lengths: np.ndarray, max_length: int, flag: str | None) -> dict:
    """Count, mean, percentiles, histogram and truncation at `max_length` of one column's token lengths.

    pN is the smallest length that at least N% of rows fit in (numpy's inverted_cdf), so a max
    length of pN truncates at most (100 - N)% of rows. `flag` names the max-length flag; with it
    come a suggested length and what that would truncate.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    edges, counts = histogram(lengths)
    stats = {
        "rows": int(lengths.size),
        "mean": float(lengths.mean()),
        "min": int(lengths.min()),
        **{f"p{q}": int(np.percentile(lengths, q, method="inverted_cdf")) for q in PERCENTILES},
        "max": int(lengths.max()),
        "flag": flag,
        "max_length": max_length,
        **_truncation(lengths, max_length, ""),
        "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
    }
    if flag:
        stats["suggested_length"] = suggest_length(lengths)
        stats.update(_truncation(lengths, stats["suggested_length"], "suggested_"))
    return stats


def _truncation(lengths: np.ndarray, limit: int, prefix: str) -> dict:
    # The rule of data.tokenize_split: a row is truncated when it has more tokens than the limit.
    rows = int(np.count_nonzero(lengths > limit))
    return {f"{prefix}truncated_rows": rows, f"{prefix}truncated_percent": 100.0 * rows / lengths.size}


def suggest_length(lengths: np.ndarray) -> int:
    """A max length for these rows; see SUGGESTION_RULE."""
    longest = int(np.max(lengths))
    length = longest if longest <= KEEP_ALL_UP_TO else int(np.percentile(lengths, 99, method="inverted_cdf"))
    return -(-length // SUGGESTION_MULTIPLE) * SUGGESTION_MULTIPLE


def histogram(lengths: np.ndarray, bins: int = HISTOGRAM_BINS) -> tuple[np.ndarray, np.ndarray]:
    """(edges, counts) of `bins` bins of equal integer width from the shortest row; fewer when the
    lengths span too few values to fill them. Bin i holds lengths in [edges[i], edges[i + 1])."""
    low, high = int(np.min(lengths)), int(np.max(lengths))
    width = -(-(high - low + 1) // bins)
    n = (high - low) // width + 1
    counts = np.bincount((np.asarray(lengths) - low) // width, minlength=n)
    return low + width * np.arange(n + 1), counts
