"""The console commands a wheel installs (pyproject.toml, [project.scripts]): each runs a top-level script.

    t5-pretrain --config_name t5-small --tokenizer_name runs/tok --train_file 'corpus/*.txt' ...
    t5-fine-tune --benchmark glue --dataset_name sst2 --model_name_or_path runs/pt/final ...
    t5-demo

take the flags of `python pre_train_t5.py`, `python fine_tune_t5.py` and `python demo.py` in a
clone, and run the same `main()` (the clone's files in an editable install, else the copies the
wheel ships: t5_training.top_level), with the same exit codes.
"""
from __future__ import annotations

import sys

from t5_training import teardown, top_level
from t5_training.errors import run_cli


def run(name: str, argv: list[str] | None = None) -> int:
    """Runs top-level script `name`'s main() on `argv` (the command line's by default); returns its exit code."""
    return run_cli(top_level.load(name).main, sys.argv[1:] if argv is None else argv)


def pretrain() -> None:
    teardown.exit_process(run("pre_train_t5"))


def fine_tune() -> None:
    teardown.exit_process(run("fine_tune_t5"))


def demo() -> None:
    teardown.exit_process(run("demo"))


COMMANDS = {"pretrain": "pre_train_t5", "fine-tune": "fine_tune_t5", "demo": "demo"}


def main(argv: list[str] | None = None) -> int:
    """`python -m t5_training.commands COMMAND FLAGS...`, for launchers that take a module:
    `accelerate launch -m t5_training.commands fine-tune --dataset_name sst2 ...`."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m t5_training.commands {{{','.join(COMMANDS)}}} [FLAGS...]", file=sys.stderr)
        return 2
    return run(COMMANDS[argv[0]], argv[1:])


if __name__ == "__main__":
    teardown.exit_process(main())
