"""The layout's rules, checked on the sources: small files and functions, no reaching into a module's private names."""
import ast
import glob
import os

from absl.testing import absltest

from tests import fixtures

PROJECT_MODULES = {"constants", "data_collator_t5", "demo", "denoisers", "fine_tune_t5", "pre_train_t5"}


def _sources(*patterns: str) -> list[str]:
    return sorted(p for pattern in patterns for p in glob.glob(os.path.join(fixtures.REPO, pattern), recursive=True))


def _project_aliases(tree: ast.Module) -> set[str]:
    """Names under which a file imports one of the project's modules (t5_training.*, the scripts, tests.*)."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for name in node.names:
                root = name.name.split(".")[0]
                if root in PROJECT_MODULES or root in ("t5_training", "tests", "_harness"):
                    aliases.add(name.asname or name.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in ("t5_training", "tests"):
                # `from t5_training import loop`: loop is a module; `from t5_training.loop import train` is not.
                aliases.update(name.asname or name.name for name in node.names
                               if os.path.exists(os.path.join(fixtures.REPO, *node.module.split("."),
                                                              name.name + ".py"))
                               or os.path.isdir(os.path.join(fixtures.REPO, *node.module.split("."), name.name)))
    return aliases


def _project_imports(tree: ast.Module) -> set[str]:
    """The project's modules a file imports from, by full name (`from t5_training.x import y`: t5_training.x)."""
    names = {name.name for node in ast.walk(tree) if isinstance(node, ast.Import) for name in node.names}
    names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name for name in names if name.split(".")[0] in PROJECT_MODULES | {"t5_training", "tests"}}


class LayoutTest(absltest.TestCase):
    def test_no_file_reaches_into_another_modules_private_names(self):
        found = []
        for path in _sources("*.py", "t5_training/**/*.py", "tests/*.py", "benchmarks/*.py"):
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            aliases = _project_aliases(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("t5_training", "tests"):
                    found += [f"{os.path.relpath(path, fixtures.REPO)}:{node.lineno} from {node.module} import "
                              f"{name.name}" for name in node.names if name.name.startswith("_")]
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id in aliases and node.attr.startswith("_")
                        and not node.attr.startswith("__")):
                    found.append(f"{os.path.relpath(path, fixtures.REPO)}:{node.lineno} {node.value.id}.{node.attr}")
        self.assertEqual(found, [], "make what another module needs public, and test it there")

    def test_package_files_and_functions_stay_small(self):
        long_files, long_functions = [], []
        for path in _sources("t5_training/**/*.py", "fine_tune_t5.py", "pre_train_t5.py", "data_collator_t5.py"):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            name = os.path.relpath(path, fixtures.REPO)
            if text.count("\n") > 350:  # about 300, with room for a docstring's growth
                long_files.append(name)
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        node.end_lineno - node.lineno + 1 > 60:
                    long_functions.append(f"{name}:{node.name}")
        self.assertEqual(long_files, [])
        self.assertEqual(long_functions, [])

    def test_the_registry_and_the_collator_import_nothing_from_the_project(self):
        # The collator's one project import is its row randomness, a leaf that imports nothing back.
        for name, allowed in (("constants.py", set()), ("data_collator_t5.py", {"t5_training.row_keys"}),
                              ("t5_training/row_keys.py", set())):
            with open(os.path.join(fixtures.REPO, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
            self.assertEqual(_project_aliases(tree), set(), name)
            self.assertEqual(_project_imports(tree), allowed, name)
        # The mixture of denoisers builds on the collator's blocks, and on nothing else of the project.
        with open(os.path.join(fixtures.REPO, "denoisers.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        self.assertEqual(_project_aliases(tree), set())
        self.assertEqual(imported & PROJECT_MODULES, {"data_collator_t5"})


if __name__ == "__main__":
    absltest.main()
