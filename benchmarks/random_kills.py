"""SIGKILL training runs at random points, resume each with `auto`, and compare with a run never killed.

For each script (fine_tune_t5.py on SST-2, pre_train_t5.py on WikiText-2, in memory and
streamed), one reference run, then N kill points drawn at random from every point a run can
die at once a checkpoint exists: after any micro-batch (mid-accumulation included), during an
evaluation, or while a checkpoint is being written. Each killed run is resumed with
`--resume_from_checkpoint auto` and must equal the reference bitwise: every step's loss, the
final weights, and the evaluation results. The harness is tests/kill_harness.py.

    python benchmarks/random_kills.py                  # 10 points per script, ~10 min on 2 cores
    python benchmarks/random_kills.py --points 3 --scripts fine_tune

Prints, per script, `10/10 identical` or the first difference of each failing point, and
writes the results to --json. Exits 1 if any point differed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import _harness  # noqa: E402,F401  (first: it puts the repository root on the path)

from tests import kill_harness  # noqa: E402  (the repository root must be on the path first)

SCENARIOS = {
    "fine_tune": lambda folder: kill_harness.fine_tune_scenario(),
    "pre_train": lambda folder: kill_harness.pre_train_scenario(folder),
    "pre_train_streaming": lambda folder: kill_harness.pre_train_scenario(folder, streaming=True),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10, help="kill points per script")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill points")
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--json", default="random_kills.json", help="where to write the results")
    args = parser.parse_args()

    results, failed = {}, False
    with tempfile.TemporaryDirectory() as root:
        for name in args.scripts:
            started = time.perf_counter()
            scenario = SCENARIOS[name](root)
            reference = kill_harness.reference_run(scenario, os.path.join(root, name, "reference"))
            points = kill_harness.random_points(scenario, args.points, args.seed)
            outcomes = {}
            for point in points:
                out = os.path.join(root, name, point.replace(":", "_"))
                try:
                    difference = kill_harness.first_difference(reference, kill_harness.kill_and_resume(
                        scenario, out, point))
                except AssertionError as err:  # the kill or the resume itself went wrong
                    difference = str(err).splitlines()[0]
                outcomes[point] = difference or "identical"
                print(f"{name:20s} kill at {point:12s} -> {outcomes[point]}", flush=True)
            same = sum(v == "identical" for v in outcomes.values())
            failed |= same != len(points)
            seconds = time.perf_counter() - started
            print(f"{name}: {same}/{len(points)} identical ({scenario.max_steps} steps, accumulation "
                  f"{scenario.accumulation}, checkpoint every {scenario.save_steps}; {seconds:.0f} s)\n", flush=True)
            results[name] = {"identical": same, "points": outcomes, "seconds": round(seconds, 1)}
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
