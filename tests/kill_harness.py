"""The kill-and-resume scenarios the tests run, on the data the tests make (fixtures, made_data.py).

The machinery that launches, kills, resumes and compares the runs is t5_training/kill_runs.py,
shared with `benchmarks/random_kills.py`; `tests/kill_resume_test.py` runs these scenarios
through it at a few fixed points.
"""
from __future__ import annotations

from t5_training import kill_runs
from tests import fixtures


def fine_tune_scenario(*extra: str) -> kill_runs.Scenario:
    """SST-2 on the tiny model, with dropout on so that the RNG state matters too; `extra` flags
    such as an adapter's (--peft lora: its checkpoints hold the adapter alone)."""
    args = fixtures.fine_tune_args("unused")
    i = args.index("--output_dir")
    return kill_runs.fine_tune_scenario(args[:i] + args[i + 2:], *extra)


def pre_train_scenario(data_dir: str, streaming: bool = False, *extra: str) -> kill_runs.Scenario:
    """Span corruption on a slice of the made corpus, packed in memory or streamed; `extra` flags such as
    another objective's (--objective ul2)."""
    corpus, held_out = kill_runs.corpus_slice(fixtures.corpus_files()[0], data_dir)
    return kill_runs.pre_train_scenario(corpus, held_out, fixtures.tokenizer_dir(), fixtures.TINY_CONFIG, streaming,
                                        *extra)
