"""Ends many two-process runs and counts how each ended: the check for a hang or abort at exit.

    python tools/two_process_ends.py --runs 150 --streams 3                 # this checkout, this Python
    python tools/two_process_ends.py --python /path/to/venv/bin/python --repo /path/to/other/checkout

Runs fine_tune_t5.py as the multi-process tests do (tests/fine_tune_t5_test.py's TwoProcessTest:
two gloo processes on the CPU, the tiny model, 4 steps, a checkpoint, evaluation and prediction),
`--runs` times, `--streams` pairs at once: three pairs on two cores load the machine as a test run
does, which is where a race at exit shows. Each run ends one of four ways:

    ended     both processes exited 0
    hung      still running after --limit seconds; killed, launcher and workers (py-spy's stack of
              each worker is kept where py-spy is installed)
    aborted   a process died of a signal ("terminate called ...", SIGABRT)
    failed    another exit code

Prints the counts, and writes every run (with the output's end of those that did not end) to
--log as JSON lines. Needs no data: the tests' made SST-2 and tokenizer are built on first use.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: how many runs, how many at once, with which Python and checkout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="two-process runs in all (default 60)")
    parser.add_argument("--streams", type=int, default=3, help="runs at once (default 3)")
    parser.add_argument("--limit", type=float, default=150.0, help="seconds before a run counts as hung (default 150)")
    parser.add_argument("--python", default=sys.executable, help="the Python whose packages run the pair")
    parser.add_argument("--repo", default=HERE, help="the checkout whose fine_tune_t5.py runs (default this one)")
    parser.add_argument("--log", default="two_process_ends.jsonl", help="one JSON line per run (appended)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.streams < 1 or args.limit <= 0:
        parser.error("--runs and --streams must be at least 1, --limit positive")
    if not os.path.isfile(os.path.join(args.repo, "fine_tune_t5.py")):
        parser.error(f"--repo {args.repo} has no fine_tune_t5.py; name a checkout of this project")
    return args


def classify(returncode: int, stderr: str) -> str:
    """How a finished (not killed) pair ended."""
    if returncode == 0:
        return "ended"
    # torch's launcher reports a worker killed by a signal as a negative exit code in its summary.
    if returncode < 0 or "terminate called" in stderr or "(SIGABRT)" in stderr:
        return "aborted"
    return "failed"


def _stacks(pids: list[int]) -> str:
    """py-spy's native stacks of the hung workers, where py-spy is installed."""
    if shutil.which("py-spy") is None:
        return ""
    dumps = []
    for pid in pids:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            dumps.append(subprocess.run(["py-spy", "dump", "--native", "--pid", str(pid)], capture_output=True,
                                        text=True, timeout=60).stdout)
    return "\n".join(dumps)


def run_once(args: argparse.Namespace, index: int) -> dict:
    """One pair, started as the multi-process tests start it; its outcome and, unless it ended, its output's end."""
    from tests import fixtures, processes

    with tempfile.TemporaryDirectory() as out:
        flags = fixtures.fine_tune_args(out, "--per_device_train_batch_size", "4", "--max_steps", "4",
                                        "--save_steps", "4", "--dropout_rate", "0", "--do_predict")
        started = time.monotonic()
        pair = processes.start_two(os.path.join(args.repo, "fine_tune_t5.py"), flags, python=args.python,
                                   cwd=args.repo)
        stacks = ""
        try:
            _, stderr = pair.communicate(timeout=args.limit)
            outcome = classify(pair.returncode, stderr)
        except subprocess.TimeoutExpired:
            outcome = "hung"
            stacks = _stacks([worker.pid for worker in processes.workers(pair)])
            _, stderr = processes.kill(pair)
    record = {"run": index, "outcome": outcome, "returncode": pair.returncode,
              "seconds": round(time.monotonic() - started, 1)}
    if outcome != "ended":
        record.update(stderr_end=stderr[-3000:], stacks=stacks)
    return record


def main(argv: list[str] | None = None) -> int:
    """Runs the pairs, logs each, prints the counts; exit code 1 if any did not end."""
    args = parse_args(argv)
    sys.path.insert(0, HERE)
    from tests import fixtures

    # The made SST-2 and tokenizer, built here once rather than by the first runs' threads at once.
    fixtures.sst2_dir()
    fixtures.tokenizer_dir()

    counts = collections.Counter()
    with open(args.log, "a", encoding="utf-8") as log, \
            concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        runs = [pool.submit(run_once, args, i) for i in range(args.runs)]
        for run in concurrent.futures.as_completed(runs):
            record = run.result()
            counts[record["outcome"]] += 1
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"run {record['run']}: {record['outcome']} ({record['seconds']} s)", flush=True)
    summary = ", ".join(f"{counts[k]} {k}" for k in ("ended", "hung", "aborted", "failed"))
    print(f"{args.runs} runs of two processes, {args.streams} at once, {args.repo}: {summary}")
    return 0 if counts["ended"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
