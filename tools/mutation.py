"""Mutation testing of core modules, each against its own test files only (pyproject.toml, [tool.mutmut]).

    python tools/mutation.py t5_training/step.py t5_training/losses.py    # tests/step_test.py, tests/losses_test.py
    python tools/mutation.py --tests tests/x_test.py t5_training/x.py

Mutates the files given (each must be in only_mutate) and runs only their tests: tests/NAME_test.py
for each NAME.py that has one, or the files named with --tests. mutmut 3.8 takes the test
selection from pyproject.toml alone, so it is set here in mutmut's loaded configuration; the
processes mutmut starts are forked from this one and inherit it. Prints each file's counts at the
end; `mutmut show MUTANT` shows one mutant's diff. mutants/ keeps the other modules' copies, so
switching modules regenerates nothing; the results of a module are reset when another one runs
(a new test selection invalidates them).
"""
import argparse
import collections
import os
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(usage="python tools/mutation.py [--tests TEST_FILE ...] MODULE.py ...")
    parser.add_argument("files", nargs="+", help="modules to mutate, as paths from the repository root")
    parser.add_argument("--tests", nargs="+", help="test files to run (default: tests/NAME_test.py of each NAME.py)")
    parser.add_argument("--max-children", default="1", help="mutants tested at once (default 1)")
    args = parser.parse_args()
    os.chdir(Path(__file__).resolve().parent.parent)  # mutmut reads pyproject.toml and writes mutants/ here

    from mutmut.configuration import config

    unknown = [f for f in args.files if not config().should_mutate(f)]
    if unknown:
        sys.exit(f"not in [tool.mutmut] only_mutate: {unknown}")
    tests = args.tests or [t for f in args.files if os.path.exists(t := f"tests/{Path(f).stem}_test.py")]
    if not tests:
        sys.exit(f"no tests/NAME_test.py for {args.files}: name the test files with --tests")
    config().pytest_add_cli_args_test_selection = tests
    # A mutant's name is its module's dotted path, then the function: t5_training.step.x_train_step__mutmut_3.
    patterns = [f"{f.removesuffix('.py').replace('/', '.')}.*" for f in args.files]
    print(f"mutating {args.files} against {tests}", flush=True)

    from mutmut.__main__ import cli
    try:
        cli.main(["run", "--max-children", args.max_children, *patterns], standalone_mode=False)
    finally:
        _summary(args.files)


def _summary(files: list[str]) -> None:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code

    for path in files:
        data = SourceFileMutationData(path=Path(path))
        data.load()
        statuses = {name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()}
        counts = collections.Counter(statuses.values())
        print(f"\n{path}: {len(statuses)} mutants, " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
        for name, status in sorted(statuses.items()):
            if status != "killed":
                print(f"    {status}: {name}")


if __name__ == "__main__":
    main()
