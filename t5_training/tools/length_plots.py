"""dataset_stats' --png: length histograms, one panel per split and column, with the max lengths marked."""
from __future__ import annotations

import os


def save_histograms(path: str, stats: dict) -> None:
    """One panel per split and column, with the planned and suggested max lengths; written atomically."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    splits = stats["splits"]
    n_columns = max(len(columns) for columns in splits.values())
    fig, axes = plt.subplots(len(splits), n_columns, figsize=(6 * n_columns, 3.2 * len(splits)), squeeze=False)
    for row, (split, columns) in zip(axes, splits.items()):
        for ax, (column, s) in zip(row, columns.items()):
            ax.stairs(s["histogram"]["counts"], s["histogram"]["edges"], fill=True, alpha=0.7)
            limits = {f"{s['flag'] or 'chunk'} {s['max_length']}": s["max_length"]}
            if s["flag"]:
                limits[f"suggested {s['suggested_length']}"] = s["suggested_length"]
            right = max(s["histogram"]["edges"][-1], s.get("suggested_length", 0))
            for (label, x), style in zip(limits.items(), ("--", ":")):
                # A limit far beyond the data would squash the bars into one corner: name it instead.
                if x <= 1.5 * right:
                    ax.axvline(x, color="black", linestyle=style, label=label)
                    right = max(right, x)
                else:
                    ax.plot([], [], " ", label=f"{label} (off the axis)")
            ax.set_xlim(0, right * 1.05)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"{split} {column}: {s['rows']:,} rows, p99 {s['p99']}, max {s['max']}")
            ax.set_xlabel("tokens")
            ax.set_ylabel("rows")
            ax.legend(fontsize="small")
    fig.tight_layout()
    tmp = f"{path}.tmp"
    try:
        fig.savefig(tmp, format="png", dpi=100)
        os.replace(tmp, path)  # a reader never sees half an image
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
