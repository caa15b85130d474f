"""The project's top-level files (the two scripts, the registry, the collator, the demo), wherever they are.

In a clone, or an editable install of one, they are the files beside this package, imported under
their own names, so that `import constants` in a user's code and the package read the same
registry. A wheel installs one package and no bare `constants` or `demo` that another project's
module of the same name could shadow: it ships the same files inside the package, as
`t5_training.shipped` (pyproject.toml), and they are loaded from there.
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

FILES = ("constants", "data_collator_t5", "demo", "fine_tune_t5", "pre_train_t5")
CLONE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_clone() -> bool:
    """Whether the package sits in a clone (its pyproject.toml beside it), not in site-packages."""
    return os.path.isfile(os.path.join(CLONE, "pyproject.toml")) and os.path.isfile(os.path.join(CLONE, "constants.py"))


def load(name: str) -> ModuleType:
    """The top-level module `name`: the clone's file, else the wheel's shipped copy."""
    if name not in FILES:
        raise ValueError(f"{name!r} is not one of the project's top-level files {FILES}")
    if not in_clone():
        return importlib.import_module(f"t5_training.shipped.{name}")
    beside = os.path.join(CLONE, f"{name}.py")
    # Appended, not prepended: a user's own module of that name earlier on the path is not replaced,
    # and is refused below rather than read as the registry.
    if CLONE not in [os.path.abspath(p or os.curdir) for p in sys.path]:
        sys.path.append(CLONE)
    module = importlib.import_module(name)
    if os.path.realpath(module.__file__ or "") != os.path.realpath(beside):
        raise ImportError(f"`import {name}` finds {module.__file__}, not this clone's {beside}: rename or move the "
                          "other module, or run from the clone")
    return module
