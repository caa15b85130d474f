"""Alias of `t5_training.tools.memory`, so that `python -m t5_training.memory` keeps its name."""
import sys

from t5_training.errors import run_cli
from t5_training.tools.memory import main

if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
