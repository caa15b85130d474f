"""Resident memory of a streamed corpus (PackedStream) against one packed in memory (pack_dataset).

A streamed corpus is read lazily: documents are tokenized in batches and cut into chunks as they
come, and only a bounded shuffle buffer is held, so resident memory should stay flat whatever the
corpus size. `pack_dataset` tokenizes and flattens the whole corpus, so its memory grows with it.

The script writes synthetic but realistic corpora to a temporary folder: lines of real text
(tinyshakespeare by default), shuffled and grouped into documents of 5 to 40 lines, one document a
line, repeated until each file reaches its size. Then, for each size and each way of reading, a
fresh Python process (so one run's memory cannot leak into the next) loads the tokenizer, notes
its resident set size (RSS), reads the corpus while a thread samples RSS every few milliseconds,
and reports chunks read, tokens per second, peak RSS and growth over the baseline.

Sizes are a base size and its multiples; the first size is the base. The script prints the
ratio of streaming's peak RSS at the largest size to that at the base (goal: at most 1.10, i.e.
peak memory within 10% at 10x the corpus). Run from the repository root (about 4 minutes on 2 CPU
cores):

    python benchmarks/streaming_memory.py                             # 20 MB and 200 MB (10x); pack_dataset at 20 MB
    python benchmarks/streaming_memory.py --base_mb 20 --multiples 1 4 10 --pack_max_mb 80
    python benchmarks/streaming_memory.py --sizes 20 80               # explicit sizes in MB, the first is the base
    python benchmarks/streaming_memory.py --quick                     # 0.2 and 2 MB, streaming only: checks it runs

It prints a table and writes --output (JSON); it reports the ratio and checks nothing.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import DATA, REPO, child_main, run_child  # noqa: E402
DEFAULT_SOURCE = os.path.join(DATA, "tinyshakespeare", "input.txt")
MB = 1 << 20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="corpora of 0.2 and 2 MB, streaming only: checks that the benchmark runs")
    parser.add_argument("--base_mb", type=float, default=None, help="base corpus size in MB (default 20; quick: 0.2)")
    parser.add_argument("--multiples", type=float, nargs="+", default=[1, 10], help="sizes as multiples of --base_mb")
    parser.add_argument("--sizes", type=float, nargs="+", default=None,
                        help="corpus sizes in MB instead of --base_mb/--multiples; the first is the base")
    parser.add_argument("--pack_max_mb", type=float, default=80,
                        help="also measure pack_dataset (in memory) on corpora up to this size; 0: never")
    parser.add_argument("--max_chunks", type=int, default=0,
                        help="stop streaming after this many chunks; 0: read the whole file")
    parser.add_argument("--chunk_length", type=int, default=568, help="568 raw tokens: 512-token T5 inputs")
    parser.add_argument("--shuffle_buffer", type=int, default=1000)
    parser.add_argument("--tokenize_batch", type=int, default=256)
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder or name; default: one trained on the demo's BBC News articles "
                             "(1000 pieces)")
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="real text whose lines are repeated")
    parser.add_argument("--workdir", default=None, help="where corpora are written (default: a temp dir, removed)")
    parser.add_argument("--interval", type=float, default=0.01, help="RSS sampling interval in seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="results JSON (default: runs/streaming_memory[_quick].json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON job of a measuring process
    args = parser.parse_args(argv)
    if args.sizes is None:
        base = args.base_mb if args.base_mb is not None else (0.2 if args.quick else 20)
        args.sizes = [base * multiple for multiple in args.multiples]
    if args.quick:
        args.pack_max_mb = 0
    name = "streaming_memory_quick.json" if args.quick else "streaming_memory.json"
    args.output = args.output or os.path.join(REPO, "runs", name)
    return args


# --- corpora ----------------------------------------------------------------------------------

def write_corpus(path: str, size_mb: float, source: str, seed: int) -> int:
    """Shuffled documents of 5-40 real lines, one per line, until the file holds size_mb MB."""
    with open(source, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    rng = random.Random(seed)
    target, written = int(size_mb * MB), 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            rng.shuffle(lines)
            start = 0
            while start < len(lines) and written < target:
                n = rng.randint(5, 40)
                doc = " ".join(lines[start:start + n]) + "\n"
                out.write(doc)
                written += len(doc.encode("utf-8"))
                start += n
    return written


# --- the measuring process ----------------------------------------------------------------------

class RssSampler:
    """Peak resident set size of this process, sampled on a thread."""

    def __init__(self, interval: float):
        import psutil

        self.process, self.interval = psutil.Process(), interval
        self.peak = self.process.memory_info().rss
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def measure(job: dict) -> dict:
    """Runs in a fresh process: read the corpus one way and report memory and speed."""
    import datasets
    import psutil
    from transformers import AutoTokenizer

    from t5_training import corpus

    datasets.disable_progress_bars()
    datasets.config.HF_DATASETS_CACHE = job["cache_dir"]  # the in-memory path's Arrow files stay in workdir
    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    tokenizer(["warm up the tokenizer once"])
    baseline = psutil.Process().memory_info().rss
    chunks = 0
    with RssSampler(job["interval"]) as sampler:
        start = time.perf_counter()
        if job["mode"] == "stream":
            stream = corpus.PackedStream([job["path"]], tokenizer, job["chunk_length"],
                                         shuffle_buffer=job["shuffle_buffer"], seed=job["seed"], cycle=False,
                                         tokenize_batch=job["tokenize_batch"])
            for _ in stream:
                chunks += 1
                if chunks == job["max_chunks"]:
                    break
        else:
            documents = corpus.load_documents([job["path"]], None, None, "train", "text", streaming=False)
            packed = corpus.pack_dataset(documents, tokenizer, job["chunk_length"])
            chunks = len(packed)
        seconds = time.perf_counter() - start
    return {"chunks": chunks, "seconds": seconds, "tokens_per_s": chunks * job["chunk_length"] / seconds,
            "baseline_mb": baseline / MB, "peak_mb": sampler.peak / MB, "growth_mb": (sampler.peak - baseline) / MB,
            "samples": sampler.samples}


# --- the table ----------------------------------------------------------------------------------

def default_tokenizer() -> str:
    """A tokenizer of 1,000 pieces, in a new temporary folder, trained on the BBC News articles the
    demo uses (they ship with the package, so the default needs no data beside the checkout)."""
    from t5_training import data, experiments
    from t5_training.tasks import get_entry

    entry = get_entry("embedded", "bbc_news")
    return experiments.make_tokenizer(tempfile.mkdtemp(prefix="streaming-memory-tokenizer-"),
                                      data.load_splits(entry)["train"]["text"], entry.label_words, 1000)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, measure)
        return None
    from t5_training import reporting

    trained = None
    if args.tokenizer is None:
        args.tokenizer = trained = default_tokenizer()
    workdir = args.workdir or tempfile.mkdtemp(prefix="streaming-memory-")
    os.makedirs(workdir, exist_ok=True)
    base = args.sizes[0]
    try:
        print(f"tokenizer {args.tokenizer}; chunk_length {args.chunk_length}; shuffle_buffer {args.shuffle_buffer}; "
              f"{os.cpu_count()} CPUs; corpora in {workdir}", flush=True)
        header = (f"{'reader':<12} {'corpus MB':>9} {'x base':>6} {'chunks read':>11} {'seconds':>8} {'tokens/s':>10} "
                  f"{'base RSS MB':>11} {'peak RSS MB':>11} {'RSS growth MB':>13}")
        rows, results = [], []
        for size in args.sizes:
            path = os.path.join(workdir, f"corpus-{size:g}mb.txt")
            written = write_corpus(path, size, args.source, args.seed)
            modes = ["stream"] + (["pack_dataset"] if size <= args.pack_max_mb else [])
            for mode in modes:
                job = {"mode": mode, "path": path, "tokenizer": args.tokenizer, "chunk_length": args.chunk_length,
                       "shuffle_buffer": args.shuffle_buffer, "tokenize_batch": args.tokenize_batch,
                       "max_chunks": args.max_chunks if mode == "stream" else 0, "seed": args.seed,
                       "interval": args.interval, "cache_dir": os.path.join(workdir, f"hf-cache-{size:g}")}
                result = run_child(__file__, {**job, "name": f"{mode}-{size:g}mb"})
                results.append({"reader": mode, "size_mb": size, "multiple": size / base, "written_mb": written / MB,
                                 **result})
                rows.append(f"{mode:<12} {written / MB:>9.1f} {size / base:>6g} {result['chunks']:>11,} "
                            f"{result['seconds']:>8.1f} {result['tokens_per_s']:>10,.0f} "
                            f"{result['baseline_mb']:>11.1f} {result['peak_mb']:>11.1f} {result['growth_mb']:>13.1f}")
                print(f"  done: {rows[-1]}", flush=True)
            os.remove(path)
            shutil.rmtree(job["cache_dir"], ignore_errors=True)
        print()
        print(header)
        print("\n".join(rows))
        summary = summarize(results, base)
        if summary:
            print(f"\nstreaming peak RSS at {summary['largest_multiple']:g}x the corpus / at 1x: "
                  f"{summary['streaming_peak_rss_ratio']:.3f} (goal <= {summary['goal_ratio']:.2f}: "
                  f"{'met' if summary['goal_met'] else 'not met'})")
        report = {"quick": args.quick, "base_mb": base, "sizes_mb": args.sizes, "chunk_length": args.chunk_length,
                  "shuffle_buffer": args.shuffle_buffer, "tokenize_batch": args.tokenize_batch, "rows": results,
                  **summary}
        reporting.write_json(args.output, report)
        print(f"wrote {args.output}")
        return report
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        if trained:
            shutil.rmtree(trained, ignore_errors=True)


def summarize(results: list[dict], base: float, goal: float = 1.10) -> dict:
    """Streaming's peak RSS at the largest corpus over that at the base size (empty with one size)."""
    streamed = {r["size_mb"]: r for r in results if r["reader"] == "stream"}
    largest = max(streamed)
    if base not in streamed or largest == base:
        return {}
    ratio = streamed[largest]["peak_mb"] / streamed[base]["peak_mb"]
    return {"largest_multiple": largest / base, "streaming_peak_rss_ratio": ratio,
            "streaming_growth_mb": {f"{size / base:g}x": r["growth_mb"] for size, r in sorted(streamed.items())},
            "goal_ratio": goal, "goal_met": ratio <= goal}


if __name__ == "__main__":
    main()
