"""Crash a training script with SIGKILL at chosen points, resume it, and compare with a run never killed.

Shared by `tests/kill_resume_test.py` (a few fixed points, in CI) and
`benchmarks/random_kills.py` (many random points). Each run is a real subprocess of the clone's
`fine_tune_t5.py` or `pre_train_t5.py`; `T5_TRAINING_KILL_AT` (see t5_training/interrupts.py)
makes it SIGKILL itself at an exact point, and the resumed run is the same command plus
`--resume_from_checkpoint auto`. What a scenario trains on (the task's flags, the corpus) is the
caller's: fine_tune_scenario and pre_train_scenario set the short, checkpoint-heavy run around it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import random
import re
import subprocess
import sys
from unittest import mock

from safetensors.torch import load_file

from t5_training import run_dir, top_level
from t5_training.errors import run_cli

REPO = top_level.CLONE


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A short run with frequent checkpoints and evaluations, so kills can land anywhere."""

    name: str
    script: str
    args: tuple[str, ...]
    max_steps: int = 12
    accumulation: int = 2
    save_steps: int = 2
    eval_steps: int = 4

    def command(self, output_dir: str) -> list[str]:
        return [sys.executable, os.path.join(REPO, self.script), *self.args, "--output_dir", output_dir,
                "--max_steps", str(self.max_steps), "--gradient_accumulation_steps", str(self.accumulation),
                "--save_steps", str(self.save_steps), "--eval_steps", str(self.eval_steps), "--logging_steps", "1",
                "--save_total_limit", "2", "--seed", "3"]

    def kill_points(self) -> list[str]:
        """Every point a kill can hit after the first checkpoint exists."""
        points = []
        for step in range(self.save_steps + 1, self.max_steps + 1):
            points += [f"micro:{step}:{k}" for k in range(1, self.accumulation + 1)]
            if step % self.eval_steps == 0 or step == self.max_steps:
                points.append(f"eval:{step}")
            if step % self.save_steps == 0 or step == self.max_steps:
                points.append(f"save:{step}")
        return points

    def position(self, point: str) -> tuple[int, int, int]:
        """Where a run reaches `point`: by step, then its micro-batches, the evaluation, the save."""
        site, step, *micro = point.split(":")
        return int(step), ("micro", "eval", "save").index(site), int(micro[0]) if micro else 0

    def expected_resume_step(self, point: str) -> int:
        """The newest checkpoint complete when the kill hits: the last save strictly before the killed step."""
        step = int(point.split(":")[1])
        return (step - 1) // self.save_steps * self.save_steps


def fine_tune_scenario(task_args: list[str], *extra: str) -> Scenario:
    """A short fine_tune_t5.py run of `task_args` (the task, model and tokenizer flags, without
    --output_dir) with dropout on, so that the RNG state matters too; `extra` flags such as an
    adapter's (--peft lora: its checkpoints hold the adapter alone)."""
    args = [*task_args, "--max_train_samples", "64", "--max_eval_samples", "16", "--per_device_train_batch_size", "4",
            "--dropout_rate", "0.1", *extra]
    return Scenario(" ".join(["fine_tune", *extra]), "fine_tune_t5.py", tuple(args))


def pre_train_scenario(corpus: str, held_out: str, tokenizer: str, config: str, streaming: bool = False,
                       *extra: str) -> Scenario:
    """Span corruption of `config` on the text files `corpus` and `held_out` (corpus_slice), packed in
    memory or streamed; `extra` flags such as another objective's (--objective ul2)."""
    args = ["--config_name", config, "--tokenizer_name", tokenizer,
            "--train_file", corpus, "--validation_file", held_out, "--max_seq_length", "32",
            "--per_device_train_batch_size", "4", "--max_eval_samples", "8", "--optim", "adamw_torch",
            "--learning_rate", "1e-3", "--warmup_steps", "2"]
    if streaming:
        args += ["--streaming", "--shuffle_buffer_size", "16"]
    name = " ".join(["pre_train_streaming" if streaming else "pre_train", *extra])
    return Scenario(name, "pre_train_t5.py", tuple(args + list(extra)))


def corpus_slice(source: str, folder: str) -> tuple[str, str]:
    """The first 240 non-empty lines of the text file `source`, as a corpus of 200 and a held-out file
    of 40 in `folder`: enough for a scenario's few steps, read in a moment."""
    with open(source, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][:240]
    paths = os.path.join(folder, "corpus.txt"), os.path.join(folder, "held_out.txt")
    for path, part in zip(paths, (lines[:200], lines[200:])):
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(part)
    return paths


def run_env(kill_at: str | None) -> dict:
    # Unbuffered: a SIGKILLed run's output would otherwise lose what it printed last (its resume line).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    env.pop("T5_TRAINING_KILL_AT", None)
    if kill_at:
        env["T5_TRAINING_KILL_AT"] = kill_at
    return env


def run(command: list[str], kill_at: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, env=run_env(kill_at), capture_output=True, text=True, timeout=timeout)


@dataclasses.dataclass
class Outcome:
    losses: list[float]
    weights: dict
    eval_results: dict


def outcome(output_dir: str) -> Outcome:
    """The finished run's per-step losses (from its last checkpoint), final weights and eval results."""
    return Outcome(run_dir.read_losses(output_dir), load_file(os.path.join(output_dir, "final", "model.safetensors")),
                   run_dir.read_final_eval(output_dir))


def first_difference(reference: Outcome, other: Outcome) -> str | None:
    """None if the two runs are identical (losses and weights bitwise), else what differs first."""
    for step, (a, b) in enumerate(zip(reference.losses, other.losses), start=1):
        if a != b:
            return f"loss of step {step}: {a!r} vs {b!r}"
    if len(reference.losses) != len(other.losses):
        return f"{len(reference.losses)} vs {len(other.losses)} steps"
    for name, tensor in reference.weights.items():
        if name not in other.weights or not tensor.equal(other.weights[name]):
            return f"final weight {name}"
    if reference.eval_results != other.eval_results:
        return f"eval results {reference.eval_results} vs {other.eval_results}"
    return None


def reference_run(scenario: Scenario, output_dir: str, in_process: bool = False) -> Outcome:
    """The run never killed. `in_process`: run the script's main() in this process (one thread, as the
    test processes run), sparing the seconds a new process spends importing torch and transformers."""
    if in_process:
        module = top_level.load(os.path.splitext(scenario.script)[0])
        with mock.patch.dict(os.environ, run_env(None)), contextlib.redirect_stdout(io.StringIO()):
            code = run_cli(module.main, scenario.command(output_dir)[2:])
        if code != 0:
            raise AssertionError(f"reference run failed ({code})")
        return outcome(output_dir)
    done = run(scenario.command(output_dir))
    if done.returncode != 0:
        raise AssertionError(f"reference run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return outcome(output_dir)


def kill_and_resume(scenario: Scenario, output_dir: str, point: str) -> Outcome:
    """Runs until `point` kills it, checks the kill and the checkpoint left, resumes, returns the outcome."""
    return kill_in_turn(scenario, output_dir, [point])


def kill_in_turn(scenario: Scenario, output_dir: str, points: list[str]) -> Outcome:
    """One run killed at each of `points` in the order a run reaches them, resumed with `auto` after
    each kill, finished by the last resume; returns its outcome.

    Each kill after the first lands in a run that was itself resumed, and the run starts one
    process per point plus one, instead of two per point.
    """
    command = scenario.command(output_dir)
    resume_step = None  # None: the first run starts fresh
    ordered = sorted(points, key=scenario.position)
    for before, point in zip([None] + ordered, ordered + [None]):
        resuming = [] if resume_step is None else ["--resume_from_checkpoint", "auto"]
        done = run(command + resuming, kill_at=point)
        if point is not None and done.returncode != -9:
            raise AssertionError(f"expected SIGKILL at {point}, got exit {done.returncode}:\n{done.stderr[-3000:]}")
        if point is None and done.returncode != 0:
            raise AssertionError(f"resume after {before} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        if resume_step is not None:
            _check_resumed_at(done, before, resume_step)
        if point is not None:
            resume_step = scenario.expected_resume_step(point)
    return outcome(output_dir)


def _check_resumed_at(done: subprocess.CompletedProcess, point: str, expected: int) -> None:
    match = re.search(r"resumed from \S*step-(\d+) at step (\d+)", done.stdout + done.stderr)
    if not match or int(match.group(2)) != expected:
        raise AssertionError(f"after a kill at {point} the run should resume at step {expected}; "
                             f"it said {match.group(0) if match else 'nothing about resuming'}")


def random_points(scenario: Scenario, n: int, seed: int) -> list[str]:
    """`n` distinct kill points, always including one mid-accumulation, one in evaluation and one in a save."""
    rng = random.Random(seed)
    points = scenario.kill_points()
    chosen = [rng.choice([p for p in points if p.startswith(site)]) for site in ("micro", "eval", "save")]
    if scenario.accumulation > 1:  # mid-accumulation: not the window's last micro-batch
        chosen[0] = rng.choice([p for p in points
                                if p.startswith("micro") and not p.endswith(f":{scenario.accumulation}")])
    rest = [p for p in points if p not in chosen]
    return chosen + rng.sample(rest, max(0, min(n - len(chosen), len(rest))))
