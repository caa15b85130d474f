"""Alias of `t5_training.tools.sweep` (its command line: t5_training/tools/sweep/cli.py), so that
`python -m t5_training.sweep` keeps its name."""
import sys

from t5_training.errors import run_cli
from t5_training.tools.sweep.cli import main

if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
