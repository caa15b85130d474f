"""The command-line tools stand apart from training: each keeps its command through a thin alias
module (`python -m t5_training.<name>`), and neither script nor any training module imports them."""
from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys

from absl.testing import absltest, parameterized

from tests import cli_batch, fixtures

# t5_training/<name>.py: the alias that keeps `python -m t5_training.<name>` running the tool.
ALIASES = ("tokenizer", "memory", "dataset_stats", "sweep")
SCRIPTS = ("fine_tune_t5.py", "pre_train_t5.py")
# Modules that drive whole runs for the demo, the benchmarks and the crash tests, as the tools do:
# they may use the tools (experiments.py trains the demo's tokenizer), and training imports neither.
DRIVERS = ("experiments", "kill_runs")


def _imports(path: str) -> set[str]:
    """Every module a file imports, as dotted names (`from a import b` gives a and a.b)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _training_files() -> list[str]:
    """The two scripts and every module of t5_training/ outside tools/, but for the aliases and the drivers."""
    package = glob.glob(os.path.join(fixtures.REPO, "t5_training", "*.py"))
    files = [p for p in package if os.path.basename(p)[:-3] not in ALIASES + DRIVERS]
    return sorted(files) + [os.path.join(fixtures.REPO, script) for script in SCRIPTS]


class AliasTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Every command in one Python start, each in a forked process of its own (tests/cli_batch.py).
        commands = [["-m", f"t5_training.{name}", "--help"] for name in ALIASES]
        commands.append(["-m", "t5_training.sweep", "no_such_sweep.yaml", "--output_dir", "unused"])
        cls.runs = cli_batch.run_python(commands, preload=["torch", "transformers"], timeout=300)

    @parameterized.parameters(*ALIASES)
    def test_the_command_keeps_its_name(self, name):
        run = self.runs[ALIASES.index(name)]
        self.assertEqual(run["returncode"], 0, run["stderr"][-2000:])
        self.assertStartsWith(run["stdout"], "usage: ")

    def test_an_error_keeps_its_exit_code(self):
        run = self.runs[-1]
        self.assertEqual(run["returncode"], 2, run["stderr"][-2000:])
        self.assertEqual(run["stderr"], "error: sweep file 'no_such_sweep.yaml' not found; pass a YAML such as "
                                        "sweeps/glue_sst2.yaml\n")

    @parameterized.parameters(*ALIASES)
    def test_an_alias_only_runs_the_tools_main(self, name):
        path = os.path.join(fixtures.REPO, "t5_training", f"{name}.py")
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        self.assertIn("Alias of `t5_training.tools.", ast.get_docstring(tree))
        body = tree.body[1:]  # after the docstring: imports, then `if __name__ == "__main__":`
        self.assertTrue(all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body[:-1]), name)
        self.assertIsInstance(body[-1], ast.If)
        self.assertEqual(ast.unparse(body[-1].test), "__name__ == '__main__'")
        self.assertTrue(any(module.startswith("t5_training.tools.") and module.endswith(".main")
                            for module in _imports(path)), name)


class LayeringTest(absltest.TestCase):

    def test_training_does_not_import_the_tools(self):
        files = _training_files()
        self.assertContainsSubset({"t5_training/loop.py", "t5_training/modeling.py", "pre_train_t5.py"},
                                  {os.path.relpath(p, fixtures.REPO) for p in files})
        tools = {f"t5_training.{name}" for name in ("tools", *ALIASES, *DRIVERS)}
        found = {}
        for path in files:
            modules = [m for m in _imports(path) if m in tools or m.startswith("t5_training.tools.")]
            if modules:
                found[os.path.relpath(path, fixtures.REPO)] = sorted(modules)
        self.assertEqual(found, {})

    def test_importing_the_scripts_loads_no_tool_and_no_optional_library(self):
        # Every run, and every refused command line, pays for what the scripts import at start:
        # libraries only some runs need (metrics, adapters, DeepSpeed, W&B) load where they are used.
        optional = ("peft", "sklearn", "scipy", "sacrebleu", "rouge_score", "deepspeed", "wandb")
        code = ("import json, sys, fine_tune_t5, pre_train_t5\n"
                "print(json.dumps(sorted(m for m in sys.modules if m.startswith('t5_training.tools')"
                f" or m.split('.')[0] in {optional!r})))")
        run = subprocess.run([sys.executable, "-c", code], cwd=fixtures.REPO, capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(run.returncode, 0, run.stderr[-2000:])
        self.assertEqual(json.loads(run.stdout.strip().splitlines()[-1]), [])

if __name__ == "__main__":
    absltest.main()
