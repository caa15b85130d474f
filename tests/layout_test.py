"""The layout's rules, checked on the sources: small files and functions, no reaching into a module's private names."""
import ast
import glob
import os

from absl.testing import absltest

from t5_training.top_level import FILES
from tests import fixtures

PROJECT_MODULES = set(FILES)  # the top-level files: the scripts, the registry, the collators users import


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
    """The project's modules a file imports, by full name: `from t5_training.x import y` is t5_training.x, and
    `from t5_training import x` is t5_training.x where x is a module (else t5_training itself)."""
    names = {name.name for node in ast.walk(tree) if isinstance(node, ast.Import) for name in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            folder = os.path.join(fixtures.REPO, *node.module.split("."))
            submodules = {f"{node.module}.{n.name}" for n in node.names
                          if os.path.exists(os.path.join(folder, n.name + ".py"))
                          or os.path.isdir(os.path.join(folder, n.name))}
            names |= submodules or {node.module}
            if len(submodules) < len(node.names):
                names.add(node.module)
    return {name for name in names if name.split(".")[0] in PROJECT_MODULES | {"t5_training", "tests"}}


def _imports_of(name: str) -> set[str]:
    with open(os.path.join(fixtures.REPO, name), encoding="utf-8") as f:
        return _project_imports(ast.parse(f.read()))


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
        for path in _sources("t5_training/**/*.py", "fine_tune_t5.py", "pre_train_t5.py", "data_collator_t5.py",
                              "constants.py", "demo.py"):
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

    def test_no_file_writes_into_a_frozen_object(self):
        # A frozen config is never changed once built: a value derived from its flags is a
        # `resolved_<flag>` property or a function's result (t5_training/config.py).
        found = []
        for path in _sources("*.py", "t5_training/**/*.py", "tests/*.py", "benchmarks/*.py", "tools/**/*.py"):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if "__setattr__" not in text:  # most files: no need to parse them
                continue
            found += [f"{os.path.relpath(path, fixtures.REPO)}:{node.lineno}" for node in ast.walk(ast.parse(text))
                      if isinstance(node, ast.Attribute) and node.attr == "__setattr__"
                      and isinstance(node.value, ast.Name) and node.value.id == "object"]
        self.assertEqual(found, [], "derive the value instead: a resolved_<flag> property or a function")

    def test_the_leaves_import_only_what_their_place_allows(self):
        # The registry is data on the entries' schema; the collators build on the rows' randomness only;
        # the mixture of denoisers on the collators' blocks; users' data_collator_t5 names the two.
        allowed = {
            "constants.py": {"t5_training.entries"},
            "t5_training/entries.py": set(),
            "t5_training/row_keys.py": set(),
            "t5_training/collators.py": {"t5_training.row_keys"},
            "t5_training/denoisers.py": {"t5_training.collators", "t5_training.errors", "t5_training.row_keys",
                                         "t5_training.span_masks"},
            "data_collator_t5.py": {"t5_training.collators", "t5_training.denoisers"},
        }
        for name, modules in allowed.items():
            self.assertEqual(_imports_of(name), modules, name)

    def test_the_package_imports_no_top_level_file_and_one_module_reads_the_registry(self):
        found, readers = [], []
        for path in _sources("t5_training/**/*.py"):
            name = os.path.relpath(path, fixtures.REPO)
            found += [f"{name} imports {m}" for m in _imports_of(name) if m.split(".")[0] in PROJECT_MODULES]
            with open(path, encoding="utf-8") as f:
                if 'load("constants")' in f.read():
                    readers.append(name)
        self.assertEqual(found, [], "the package reaches a top-level file through t5_training.top_level.load")
        self.assertEqual(readers, ["t5_training/registry.py"])

    def test_the_scripts_are_tables_of_contents(self):
        for name in ("fine_tune_t5.py", "pre_train_t5.py"):
            with open(os.path.join(fixtures.REPO, name), encoding="utf-8") as f:
                self.assertLessEqual(f.read().count("\n"), 160, name)

    def test_benchmarks_import_neither_the_demo_nor_the_tests(self):
        # What benchmarks share with the demo lives in the package (t5_training.experiments, kill_runs):
        # the demo is README's first command, and the tests are not shipped.
        found = []
        for path in _sources("benchmarks/*.py"):
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [name.name for name in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found += [f"{os.path.relpath(path, fixtures.REPO)}:{node.lineno} {name}" for name in names
                          if name.split(".")[0] in ("demo", "tests")]
        self.assertNotEmpty(_sources("benchmarks/*.py"))
        self.assertEqual(found, [])


if __name__ == "__main__":
    absltest.main()
