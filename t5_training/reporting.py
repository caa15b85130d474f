"""What a finished run leaves for people: results JSON, a metric table, a loss-curve PNG."""
from __future__ import annotations

import json
import os
from typing import Mapping, Sequence


def write_json(path: str, values: Mapping) -> None:
    """Writes `values` as indented JSON, atomically (a reader never sees half a file), creating
    the folder it goes in if need be."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(values, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
        os.replace(tmp, path)
    except OSError:
        # A full disk: leave no half-written file behind; the previous `path`, if any, stands.
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def format_table(rows: Sequence[Mapping[str, object]]) -> str:
    """A plain-text table with one column per key of the first row."""
    if not rows:
        return ""
    columns = list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def _cell(value) -> str:
    if value is None:  # a column this row has no value for
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def save_loss_curves(path: str, panels: Mapping[str, Mapping[str, Sequence[float]]]) -> None:
    """One PNG with a panel per title and, in each, a line per named loss curve (per optimizer
    step), smoothed over a window of 1/50 of the run for readability."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels.items()):
        for name, losses in curves.items():
            window = max(1, len(losses) // 50)
            smooth = [sum(losses[max(0, i - window + 1): i + 1]) / len(losses[max(0, i - window + 1): i + 1])
                      for i in range(len(losses))]
            ax.plot(range(1, len(losses) + 1), smooth, label=name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("cross-entropy per target token")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def paired_interval(treated: Sequence[float], control: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean of the paired differences treated - control and its two-sided Student t interval.

    Pairs share everything but the treatment (the same seed, rows and steps), so the
    seed-to-seed spread that both sides share cancels out of the differences. With one pair
    the interval is unbounded (NaN).
    """
    import scipy.stats

    if len(treated) != len(control) or not treated:
        raise ValueError(f"need the same number of paired values, got {len(treated)} and {len(control)}")
    diffs = [t - c for t, c in zip(treated, control)]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "pairs": n, "wins": int(mean > 0)}
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
    half = float(scipy.stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / n ** 0.5
    return {"mean": mean, "low": mean - half, "high": mean + half, "pairs": n, "wins": sum(d > 0 for d in diffs)}
