"""The task registry users edit (constants.py's DATASET_VALS): the one module of the package that reads it.

Every other module takes entries from here, and their types from `t5_training.entries`, so the
registry a run uses is the clone's constants.py (or a wheel's copy of it) and one object: a
test or a user that patches `constants.DATASET_VALS` patches what the package reads.
"""
from __future__ import annotations

from typing import Mapping

from t5_training import top_level
from t5_training.entries import TaskEntry

_constants = top_level.load("constants")

DATASET_VALS: Mapping[str, Mapping[str, TaskEntry]] = _constants.DATASET_VALS
GLUE: Mapping[str, TaskEntry] = _constants.GLUE
EMBEDDED: Mapping[str, TaskEntry] = _constants.EMBEDDED
