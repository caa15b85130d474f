"""Multi-task mixtures: which tasks, at what rates, and the order their training rows are drawn in.

    accelerate launch fine_tune_t5.py --benchmark glue --dataset_name all --data_dir glue_data \
        --mixing examples_proportional --mixing_cap 65536 ...

Rates follow T5 (Raffel et al. 2020, §3.5.2) as its code computes them (seqio's
`mixing_rate_num_examples`, which t5.data.rate_num_examples calls): a task's rate is its number of
*training* examples, capped at the artificial limit K (`--mixing_cap`) and only then raised to
1/T (`--mixing_temperature`); "equal" gives every task the same rate. The rates are normalised to
sum to 1.

`MixtureSampler` draws the rows. Like the single-task samplers it is a pure function of (seed,
epoch): each epoch of the mixture holds a fixed number of rows, split among the tasks in exact
proportion to their rates (largest remainders, carried from epoch to epoch) and shuffled, and a
task's share walks through fresh permutations of its rows. The loop's data position
(`TrainState.epoch`, `samples_in_epoch`) therefore says exactly which rows come next, so resuming
is exact, and accelerate deals each global batch out to the processes without a row twice, as
for one task.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from typing import Iterator, Literal, Mapping, Sequence

import torch

from t5_training.errors import UsageError
from t5_training.samplers import epoch_generator, group_by_length

MODES = ("examples_proportional", "temperature", "equal")
ALL = "all"
ROWS_FILE = "mixture_rows.tsv"
RATES_FILE = "mixture_rates.json"


@dataclass(frozen=True)
class MixtureConfig:
    """The mixture flags of fine_tune_t5.py; they apply when --dataset_name names several tasks."""

    mixing: Literal[MODES] | None = field(
        default=None, metadata={"help": "How a mixture (--dataset_name all or a comma list) samples its tasks "
                                        "in training, as T5 section 3.5.2: examples_proportional (the default), "
                                        "temperature, equal."})
    mixing_cap: int | None = field(
        default=None, metadata={"help": "T5's artificial data set size limit K: a task counts at most K training "
                                        "examples (before the temperature). Unset: no limit."})
    mixing_temperature: float | None = field(
        default=None, metadata={"help": "T for --mixing temperature: rates proportional to size^(1/T)."})

    def mixture_flags_set(self) -> list[str]:
        """The flags above that were set (as --name): unset, each is None."""
        names = ("mixing", "mixing_cap", "mixing_temperature")
        return [f"--{name}" for name in names if getattr(self, name) is not None]

    def check_mixture_flags(self, tasks: Sequence[str]) -> None:
        """One line for each misuse of the flags above, given the tasks --dataset_name named."""
        given = self.mixture_flags_set()
        if len(tasks) < 2:
            if given:
                raise UsageError(f"{given[0]} mixes several tasks, and --dataset_name names one ({tasks[0]}); "
                                 "name several (e.g. --dataset_name cola,sst2 or all) or drop the mixture flags")
            return
        mode = self.mixing or "examples_proportional"
        if self.mixing_temperature is not None and self.mixing_temperature <= 0:
            raise UsageError(f"--mixing_temperature must be positive, got {self.mixing_temperature}; "
                             "T5 used 2, 8 and 256 (1 is examples-proportional)")
        if mode == "temperature" and self.mixing_temperature is None:
            raise UsageError("--mixing temperature needs --mixing_temperature T (rates ∝ size^(1/T); "
                             "T5 used 2, 8, 256)")
        if mode != "temperature" and self.mixing_temperature is not None:
            raise UsageError(f"--mixing_temperature applies to --mixing temperature, not {mode}; add "
                             "--mixing temperature or drop it")
        if self.mixing_cap is not None and self.mixing_cap < 1:
            raise UsageError(f"--mixing_cap must be at least 1, got {self.mixing_cap}; T5 used 2^16 to 2^21")
        if mode == "equal" and self.mixing_cap is not None:
            raise UsageError("--mixing_cap limits the sizes that rates are computed from, and --mixing equal uses "
                             "no size; drop --mixing_cap or use examples_proportional or temperature")


def task_names(tasks: Mapping, dataset_name: str) -> tuple[str, ...]:
    """The tasks `--dataset_name` names among `tasks` (a benchmark's registry): `all`, a comma list, or one."""
    if dataset_name == ALL:
        return tuple(tasks)
    names = tuple(name.strip() for name in dataset_name.split(","))
    if len(names) == 1:
        return names  # one task: tasks.get_entry names an unknown one
    unknown = [name for name in names if name not in tasks]
    if unknown:
        raise UsageError(f"unknown task {unknown[0]!r} in --dataset_name {dataset_name!r}; known: "
                         f"{', '.join(tasks)}, or all")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UsageError(f"--dataset_name names {repeated[0]} twice; name each task once (rates come from "
                         "--mixing)")
    return names


def mixing_rates(sizes: Mapping[str, int], mode: str, cap: int | None = None,
                 temperature: float | None = None) -> dict[str, float]:
    """Each task's share of the mixture's rows, summing to 1 (T5 §3.5.2, as the module docstring says).

    `sizes` are the tasks' numbers of training rows. The cap is applied before the temperature,
    as seqio's mixing_rate_num_examples does: min(size, K) ** (1 / T).
    """
    if mode == "equal":
        raw = {name: 1.0 for name in sizes}
    else:
        t = temperature if mode == "temperature" else 1.0
        raw = {name: float(min(size, cap) if cap else size) ** (1.0 / t) for name, size in sizes.items()}
    total = sum(raw.values())
    return {name: rate / total for name, rate in raw.items()}


def apportion(rates: Sequence[float], rows: int) -> list[int]:
    """`rows` split in proportion to `rates`, the remainder to the largest fractions (ties: the first task)."""
    exact = [rate * rows for rate in rates]
    counts = [math.floor(x) for x in exact]
    by_fraction = sorted(range(len(rates)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_fraction[:rows - sum(counts)]:
        counts[i] += 1
    return counts


def epoch_counts(rates: Sequence[float], rows: int, epoch: int = 0) -> list[int]:
    """Each task's rows in epoch `epoch` of `rows` rows: what `apportion` gives the epochs up to it, less
    what it gave those before. So every task's count from the start stays within one row of its exact
    share, however small its share of one epoch (rounding each epoch alone would repeat its error)."""
    before, after = apportion(rates, rows * epoch), apportion(rates, rows * (epoch + 1))
    return [b - a for a, b in zip(before, after)]


class MixtureSampler(torch.utils.data.Sampler[int]):
    """Rows of several tasks laid end to end (task i's rows at `offsets[i]`...), drawn at `rates`.

    An epoch is `epoch_rows` rows (a whole number of global batches, so no process ever pads a
    short last batch with rows drawn twice). Its order is a function of (seed, epoch) alone:
    task i takes `epoch_counts(rates, epoch_rows, epoch)[i]` of its positions, spread by a seeded shuffle, and fills
    them from seeded permutations of its rows, one after another. With `lengths` (the source
    lengths, --group_by_length) the epoch is then grouped by length per `batch_size` global
    batch exactly as samplers.LengthGroupedSampler groups one task.
    """

    def __init__(self, sizes: Sequence[int], rates: Sequence[float], epoch_rows: int, seed: int, *,
                 lengths: Sequence[int] | None = None, batch_size: int = 1):
        # At least one row per task and epoch keeps every epoch's count (epoch_counts) non-negative.
        if len(sizes) != len(rates) or min(sizes) < 1 or min(rates) * epoch_rows < 1:
            raise ValueError(f"bad mixture: sizes {list(sizes)}, rates {list(rates)}, {epoch_rows} rows per epoch")
        self.sizes = list(sizes)
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.rates = list(rates)
        self.epoch_rows = epoch_rows
        self.seed = seed
        self.lengths = None if lengths is None else torch.as_tensor(lengths, dtype=torch.int64)
        self.batch_size = batch_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.epoch_rows

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's rows, as indices into the tasks' rows laid end to end."""
        counts = epoch_counts(self.rates, self.epoch_rows, epoch)
        generator = epoch_generator(self.seed, epoch)
        slots = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
        slots = slots[torch.randperm(self.epoch_rows, generator=generator)]
        order = torch.empty(self.epoch_rows, dtype=torch.int64)
        for task, (size, offset, count) in enumerate(zip(self.sizes, self.offsets, counts)):
            # Each task has its own stream, so its rows do not depend on the other tasks' counts.
            rows = epoch_generator(self.seed, epoch, task + 1)
            passes = [torch.randperm(size, generator=rows) for _ in range(-(-count // size))]
            order[slots == task] = (torch.cat(passes)[:count] if passes else torch.empty(0, dtype=torch.int64)) + offset
        if self.lengths is not None:
            order = torch.tensor(group_by_length(order, self.lengths, self.batch_size, generator))
        return order

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch).tolist())

    def task_rows(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(task number, row within that task's training split) of each index into the rows end to end."""
        tasks = torch.bucketize(indices, torch.tensor(self.offsets[1:]), right=True)
        return tasks, indices - torch.tensor(self.offsets)[tasks]

    def trained(self, epoch: int, samples_in_epoch: int) -> torch.Tensor:
        """Every row drawn from the start up to the data position (`epoch`, `samples_in_epoch`), in order."""
        return torch.cat([self.order(e) for e in range(epoch)] + [self.order(epoch)[:samples_in_epoch]])


def task_record(names: Sequence[str], sampler: MixtureSampler) -> dict:
    """What a mixture of tasks draws from, as a checkpoint records it (TrainState.mixture)."""
    return {"tasks": list(names), "train_rows": sampler.sizes, "rates": sampler.rates, "epoch_rows": sampler.epoch_rows}


def one_task_record(name: str, train_rows: int) -> dict:
    """What a run of one task draws from, as a checkpoint records it (TrainState.mixture)."""
    return {"task": name, "train_rows": train_rows}


def check_same_tasks(saved: dict, now: dict, path: str) -> None:
    """Refuses to resume from a checkpoint whose data position names other rows: one that drew from another
    mixture or another task (or another number of its rows), a mixture's resumed as one task, or one
    task's resumed into a mixture. A one-task checkpoint of an earlier version records nothing: it
    resumes into one task as before."""
    if saved == now or (not saved and "tasks" not in now):
        return

    def show(m):
        if "tasks" not in m:
            return f"{m['task']} ({m['train_rows']} training rows)" if m else "one task (it records no mixture)"
        return ", ".join(f"{t} {100 * r:.2f}% of {n}" for t, r, n in zip(m["tasks"], m["rates"], m["train_rows"]))

    fix = ("resume with its --dataset_name, mixing flags and --max_train_samples, or start a new run from its "
           "weights with --model_name_or_path")
    if "tasks" not in now:
        first = f"a mixture ({show(saved)})" if "tasks" in saved else show(saved)
        raise UsageError(f"checkpoint {path} was trained on {first} and this run trains {show(now)}; " + fix)
    if "tasks" not in saved:
        raise UsageError(f"checkpoint {path} was trained on {show(saved)} and this run mixes {show(now)}; " + fix)
    raise UsageError(f"checkpoint {path} was trained on another mixture ({show(saved)}) than this run's "
                     f"({show(now)}); " + fix)


def write_trained_rows(output_dir: str, names: Sequence[str], sampler: MixtureSampler, epoch: int,
                       samples_in_epoch: int, log=print) -> dict:
    """Writes mixture_rows.tsv (every row trained on, in order) and mixture_rates.json; returns the latter.

    mixture_rates.json has, per task, its training rows, the configured rate, the realised rate
    (its share of the rows trained on) and how many distinct rows of it were seen.
    """
    tasks, rows = sampler.task_rows(sampler.trained(epoch, samples_in_epoch))
    path = os.path.join(output_dir, ROWS_FILE)
    with open(f"{path}.tmp", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["position", "task", "row"])
        writer.writerows((i, names[t], r) for i, (t, r) in enumerate(zip(tasks.tolist(), rows.tolist())))
    os.replace(f"{path}.tmp", path)
    total = max(len(tasks), 1)
    summary = {}
    for i, name in enumerate(names):
        mine = rows[tasks == i]
        summary[name] = {"train_rows": sampler.sizes[i], "configured_rate": sampler.rates[i],
                         "realised_rate": len(mine) / total, "rows_trained": len(mine),
                         "distinct_rows": len(torch.unique(mine))}
    with open(os.path.join(output_dir, RATES_FILE), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    log("mixture: " + ", ".join(f"{name} {s['rows_trained']} rows ({100 * s['realised_rate']:.2f}% vs "
                                f"{100 * s['configured_rate']:.2f}% configured)" for name, s in summary.items()))
    return summary
