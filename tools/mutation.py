"""Mutation testing of core modules, each against its own test files only (pyproject.toml, [tool.mutmut]).

    python tools/mutation.py t5_training/step.py t5_training/losses.py    # tests/step_test.py, tests/losses_test.py
    python tools/mutation.py --tests tests/x_test.py --tests tests/y_test.py t5_training/x.py
    python tools/mutation.py --not-killed t5_training/step.py t5_training/losses.py   # after new tests or pragmas

Mutates the files given (each must be in only_mutate) and runs only their tests: tests/NAME_test.py
for each NAME.py that has one, or the files named with --tests (one file per flag, repeated for
more). mutmut 3.8 takes the test selection from pyproject.toml alone, so it is set here in mutmut's
loaded configuration; the processes mutmut starts are forked from this one and inherit it. Prints
each file's counts at the end; `mutmut show MUTANT` shows one mutant's diff. mutants/ keeps the
other modules' copies, so switching modules regenerates nothing; the results of a module are reset
when another one runs (a new test selection invalidates them).

--not-killed reruns, of the same module's last run, only the mutants that did not die and those of
functions changed since (mutmut regenerates a changed function's mutants with no result): a
mutant killed before stays killed when tests are only added. The counts printed are the whole
file's.
"""
import argparse
import collections
import os
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: the modules to mutate, and optionally their test files and the rerun switch."""
    parser = argparse.ArgumentParser(
        usage="python tools/mutation.py [--tests TEST_FILE [--tests TEST_FILE ...]] [--not-killed] MODULE.py ...")
    parser.add_argument("files", nargs="+", help="modules to mutate, as paths from the repository root")
    # One file per flag: a flag taking several would swallow the modules that follow it.
    parser.add_argument("--tests", action="append", metavar="TEST_FILE",
                        help="a test file to run, repeatable (default: tests/NAME_test.py of each NAME.py)")
    parser.add_argument("--max-children", default="1", help="mutants tested at once (default 1)")
    parser.add_argument("--not-killed", action="store_true",
                        help="rerun only the mutants the module's last run did not kill, and changed functions'")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.chdir(Path(__file__).resolve().parent.parent)  # mutmut reads pyproject.toml and writes mutants/ here
    # Each mutant's tests run in a process of their own: the fixture tokenizer is trained once and
    # kept (tests/fixtures.py), not trained again for every mutant, which took longer than the tests.
    os.environ.setdefault("T5_TRAINING_FIXTURE_CACHE", os.path.abspath("mutants/.fixture-cache"))

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
    if args.not_killed:
        patterns = _not_killed(args.files)
        print(f"rerunning {len(patterns)} mutants that were not killed or are new", flush=True)
        if not patterns:
            _summary(args.files)
            return

    from mutmut.__main__ import cli
    try:
        cli.main(["run", "--max-children", args.max_children, *patterns], standalone_mode=False)
    finally:
        _summary(args.files)


def _not_killed(files: list[str]) -> list[str]:
    """The names of the files' mutants with no result or one other than killed, after regenerating changed files."""
    from mutmut.__main__ import create_mutants
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import copy_src_dir

    copy_src_dir()
    create_mutants(1)  # rewrites only files changed since their mutants were made
    names = []
    for path in files:
        data = SourceFileMutationData(path=Path(path))
        data.load()
        names += [name for name, code in data.exit_code_by_key.items()
                  if code is None or status_by_exit_code[code] != "killed"]
    return names


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
