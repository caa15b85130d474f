"""What the benchmarks share: the repository on the path, the data folder, offline child
processes, sides run in fresh processes in alternating order, and their statistics.

A benchmark script does `import _harness` first (its own folder is on the path when it runs as
`python benchmarks/NAME.py`), which puts the repository root on the path for its other imports.
A measurement that must not share a process with another runs as `NAME.py --child JOB`:
`run_child` writes the job file and reads back the result file that `child_main` writes.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
# benchmarks/peft.py shares its name with the peft package, which transformers imports: this
# folder goes last on the path, where the benchmarks still find each other but no package
# of that name is hidden.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE] + [HERE]

# The real data (GLUE's SST-2, CoLA, MRPC, STS-B; WikiText-2; Tiny Shakespeare): the folder that
# T5_TRAINING_DATA names, as for the tests (docs/development.md), or ../shared/data beside the checkout.
DATA = os.environ.get("T5_TRAINING_DATA") or os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
SST2_DIR = os.path.join(DATA, "SST-2")
WIKITEXT = [os.path.join(DATA, "wikitext-2", "tokenized", name) for name in ("valid.txt", "test.txt")]
TINY_CONFIG = os.path.join(REPO, "configs", "t5-tiny.json")
# Child processes must never wait on the network, and all sides see the same environment.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
               "TOKENIZERS_PARALLELISM": "false"}
THREADS_HELP = ("torch threads in every process; 0: torch's default, one per core (quick: 1). On a machine "
                "other jobs keep busy, 2 threads on 2 cores stall at every parallel region (a t5-small step "
                "measured 7-20 s instead of 2 s), so pass --threads 1 there for steady ratios")


def rss_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status (Linux), in KiB: VmRSS (resident now),
    VmHWM (resident at peak), RssFile (file pages)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)[1])


def peak_rss_mib() -> float:
    """This process's peak resident memory since it started, in MiB: VmHWM, not getrusage's
    ru_maxrss, which a process started by fork and exec inherits from its parent (a benchmark's
    run would report its parent's peak whenever the parent held more)."""
    return rss_kib("VmHWM") / 1024


def set_environment(threads: int) -> None:
    """Offline, and `threads` OpenMP/MKL threads, for this process and every child it starts.

    Set before torch is imported (this module imports it lazily), so it holds here too.
    """
    os.environ.update(OFFLINE_ENV)
    if threads:
        os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))


def add_device_argument(parser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where every side runs (cpu hides any GPU from the children; default cpu)")


def use_device(device: str) -> None:
    """Makes `device` the one every child process runs on, or stops with one line if it is missing.

    Called by the parent only: a child inherits the choice through its environment.
    """
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # every side on the CPU, also on a machine with a GPU
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(f"error: --device {device}: no CUDA device is visible here; use --device cpu")


def run_child(script: str, job: dict, work_dir: str | None = None, env: dict | None = None) -> dict:
    """Runs one measurement in a fresh Python process (`script --child JOB_FILE`) and returns its result.

    The job file, the result file and the child's log go to `work_dir` (a temporary folder,
    removed once the result is read, when None); `env` is added to this process's environment.
    """
    name = job.get("name", "child")
    folder = work_dir or tempfile.mkdtemp(prefix="benchmark-child-")
    job_path = os.path.join(folder, f"{name}.job.json")
    job = {**job, "result": os.path.join(folder, f"{name}.result.json")}
    if os.path.exists(job["result"]):
        os.remove(job["result"])  # never read a previous run's figures
    with open(job_path, "w", encoding="utf-8") as f:
        json.dump(job, f)
    log_path = os.path.join(folder, f"{name}.log")
    started = time.perf_counter()
    returncode = start_child([os.path.abspath(script), "--child", job_path], log_path, {**os.environ, **(env or {})})
    if returncode != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"{name} failed (exit {returncode}); end of {log_path}:\n{tail}")
    with open(job["result"], encoding="utf-8") as f:
        result = json.load(f)
    if work_dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"  {name}: done in {time.perf_counter() - started:.0f} s (process included)", flush=True)
    return result


def start_child(argv: list[str], log_path: str, env: dict) -> int:
    """`python ARGV...` in the repository root with `env`, its output (stdout and stderr) to `log_path`;
    returns its exit code. The suite's quick runs replace it with a process forked after the imports
    (tests/cli_batch.py), as they check results, not timings, and a start is 8 s of imports."""
    with open(log_path, "w", encoding="utf-8") as log:
        return subprocess.run([sys.executable, *argv], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              env=env).returncode


def child_main(job_path: str, measure) -> None:
    """Runs `measure(job)` for the job file `job_path` and writes its result where the job says."""
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    result = measure(job)
    with open(job["result"], "w", encoding="utf-8") as f:
        json.dump(result, f)


def measured_side(measure):
    """`measure` plus what makes one side's figures comparable with another's: its side and
    repeat, its torch thread count and the machine's load average around it."""

    def run(job: dict) -> dict:
        import torch

        from torch._dynamo.utils import counters

        load_before, graphs_before = load_average(), counters["stats"]["unique_graphs"]
        result = measure(job)
        # Recorded afterwards: the figures are only comparable if no side changed its thread count.
        # And the graphs torch.compile made, so that a compiled side shows it compiled.
        result.update(side=job["side"], repeat=job["repeat"], threads=torch.get_num_threads(),
                      load_average={"before": load_before, "after": load_average()},
                      compiled_graphs=counters["stats"]["unique_graphs"] - graphs_before)
        return result

    return run


def record_steps() -> list[dict]:
    """Each optimizer step the project's loop runs in this process from now on, as it ends: its
    `start` and `end` (perf_counter, the GPU synchronized first), the `graphs` torch.compile made
    during it, and its `window` of batches. The loop's `train_step` is wrapped for the rest of the
    process, which runs one side and exits."""
    import torch
    from torch._dynamo.utils import counters

    from t5_training import loop

    steps, real = [], loop.train_step

    def recorded_step(accelerator, model, optimizer, window, *args, **kwargs):
        graphs, start = counters["stats"]["unique_graphs"], time.perf_counter()
        loss = real(accelerator, model, optimizer, window, *args, **kwargs)
        if accelerator.device.type == "cuda":
            torch.cuda.synchronize(accelerator.device)
        steps.append({"start": start, "end": time.perf_counter(),
                      "graphs": counters["stats"]["unique_graphs"] - graphs, "window": window})
        return loss

    loop.train_step = recorded_step
    return steps


def run_sides(script: str, sides: tuple[str, ...], repeats: int, base: dict, work_dir: str, side_job,
              keep_run_dirs: bool = True) -> list[dict]:
    """Runs every side `repeats` times, each run a fresh process (run_child); returns the results.

    The order alternates between repeats, so that no side always runs first on a machine that
    warms up or gets busy. `side_job(side)` adds that side's own job fields to `base`.
    """
    runs = []
    for repeat in range(repeats):
        for side in sides if repeat % 2 == 0 else tuple(reversed(sides)):
            name = f"{side.replace(' ', '_')}-{repeat}"
            run_dir = os.path.join(work_dir, name)
            shutil.rmtree(run_dir, ignore_errors=True)
            job = {**base, "name": name, "side": side, "repeat": repeat, "run_dir": run_dir, **side_job(side)}
            runs.append(run_child(script, job, work_dir))
            if not keep_run_dirs:
                shutil.rmtree(run_dir, ignore_errors=True)
    return runs


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def median_of(runs: list[dict], side: str, key: str) -> float:
    return statistics.median(r[key] for r in runs if r["side"] == side)


def best_of(runs: list[dict], side: str, key: str) -> float:
    return max(r[key] for r in runs if r["side"] == side)


# --- SST-2 sides (fine-tuning and evaluation throughput) --------------------------------------

def prepare_tokenizer_and_model(work_dir: str, model_config: str, vocab_size: int, seed: int) -> tuple[str, str]:
    """Trains the SST-2 tokenizer and saves one randomly initialised model; returns both folders.

    Every side then loads these exact weights with from_pretrained, so no side depends on how
    the other seeds its initialisation.
    """
    import csv

    import torch

    from t5_training.modeling import load_model, load_tokenizer
    from t5_training.tools.tokenizer import train_tokenizer

    tokenizer_dir = os.path.join(work_dir, "tokenizer")
    model_dir = os.path.join(work_dir, "initial_model")
    with open(os.path.join(SST2_DIR, "train.tsv"), encoding="utf-8") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(rows)
        sentences = [row[0] for _, row in zip(range(20000), rows)]
    # The label words must be pieces of their own, as in T5's vocabulary.
    train_tokenizer(sentences + ["sst2 sentence: negative positive"] * 50, tokenizer_dir, vocab_size=vocab_size)
    tokenizer = load_tokenizer(tokenizer_dir)
    torch.manual_seed(seed)
    model = load_model(None, model_config, tokenizer)
    model.save_pretrained(model_dir)
    return tokenizer_dir, model_dir


def tokenized_rows(job: dict, tokenizer, split: str, rows: int):
    """The split's rows exactly as fine_tune_t5.py tokenizes them (registry entry, same truncation)."""
    from t5_training import data
    from t5_training.tasks import get_entry

    entry = get_entry("glue", "sst2")
    ds = data.load_splits(entry, data_dir=SST2_DIR)[split]
    if rows:
        ds = ds.select(range(min(rows, len(ds))))
    return data.tokenize_split(ds, entry, tokenizer, job["max_source_length"], job["max_target_length"]).dataset
