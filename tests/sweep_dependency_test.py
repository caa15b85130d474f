"""The sweep runner without W&B's `sweeps` package: one line naming the install, never the YAML folder.

`sweeps` is not a dependency (it pins numpy<2, so it is installed with --no-deps). Without it,
`import sweeps` from the repository root still succeeds: it finds the repository's own sweeps/
folder of YAMLs, which has no __init__.py, as a namespace package, and the runner and its tests
then failed on "module 'sweeps' has no attribute ...". These tests hide the installed package
from the import system (they run whether it is installed or not) and check that this counts as
missing. tests/sweep_test.py, which needs the package, skips naming the install command instead.
"""
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import sys
import tempfile
import unittest
from unittest import mock

from absl.testing import absltest

from t5_training.errors import EXIT_USAGE, UsageError, run_cli
from t5_training.tools.sweep import cli, engine
from tests import fixtures

INSTALL = "pip install --no-deps sweeps==0.3.0"


class _OnlyTheRepositoryFolder(importlib.abc.MetaPathFinder):
    """Finds `sweeps` as an interpreter without the package does from the repository root: its sweeps/ folder."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] != "sweeps":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [fixtures.REPO] if name == "sweeps" else path)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec


@contextlib.contextmanager
def _sweeps_not_installed():
    """sys.modules and the import system as without the package; both put back afterwards."""
    with mock.patch.dict(sys.modules), mock.patch.object(sys, "meta_path", [_OnlyTheRepositoryFolder(),
                                                                            *sys.meta_path]):
        for name in [n for n in sys.modules if n.partition(".")[0] == "sweeps"]:
            del sys.modules[name]
        yield


def _fresh_module(name, path):
    """The module at `path` executed anew under `name`, leaving the imported one alone."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class MissingSweepsTest(absltest.TestCase):

    def test_the_repository_folder_is_what_import_finds(self):
        # The situation itself: without the package, `import sweeps` does not fail.
        with _sweeps_not_installed():
            found = importlib.import_module("sweeps")
            self.assertIsNone(getattr(found, "__file__", None))
            self.assertEqual(list(found.__path__), [os.path.join(fixtures.REPO, "sweeps")])
            self.assertFalse(hasattr(found, "next_run"))

    def test_the_folder_counts_as_missing_and_require_names_the_install(self):
        with _sweeps_not_installed():
            fresh = _fresh_module("_engine_without_sweeps", engine.__file__)
            self.assertIsNone(fresh.sweeps)
            # Nor is the folder left in sys.modules for the next `import sweeps` to reuse.
            self.assertNotIn("sweeps", sys.modules)
            with self.assertRaisesRegex(UsageError, "sweeps package, which is not installed: " + INSTALL):
                fresh.require()
            with self.assertRaises(UsageError):  # the engine's own entry points, not AttributeError
                fresh.propose({"method": "random", "parameters": {}}, [], seed=0)

    def test_the_runner_says_so_in_one_line_before_writing_anything(self):
        stderr = io.StringIO()
        with tempfile.TemporaryDirectory() as root, mock.patch.object(engine, "sweeps", None), \
                contextlib.redirect_stderr(stderr):
            out = os.path.join(root, "sweep")
            code = run_cli(cli.main, [os.path.join(fixtures.REPO, "sweeps", "glue_sst2.yaml"), "--output_dir", out])
            self.assertFalse(os.path.exists(out))
        self.assertEqual(code, EXIT_USAGE)
        self.assertEqual(stderr.getvalue(), f"{UsageError.prefix}: {engine.MISSING_SWEEPS}\n")
        self.assertIn(INSTALL, stderr.getvalue())

    def test_sweep_test_skips_naming_the_install(self):
        # Executed anew under another name (not put in sys.modules); what it imports is real and stays.
        with mock.patch.object(engine, "sweeps", None):
            with self.assertRaisesRegex(unittest.SkipTest, "needs W&B's sweeps package: " + INSTALL):
                _fresh_module("_sweep_test_without_sweeps", os.path.join(fixtures.REPO, "tests", "sweep_test.py"))


class InstalledSweepsTest(absltest.TestCase):

    def test_the_installed_package_is_the_one_imported(self):
        if engine.sweeps is None:
            self.skipTest(f"W&B's sweeps package is not installed: {INSTALL}")
        # A real package (a file of its own, outside the repository) with the engine in it.
        self.assertTrue(engine.sweeps.__file__.endswith(os.path.join("sweeps", "__init__.py")))
        self.assertNotEqual(os.path.dirname(os.path.dirname(engine.sweeps.__file__)), fixtures.REPO)
        self.assertTrue(callable(engine.sweeps.next_run))
        self.assertIs(engine.require(), engine.sweeps)


if __name__ == "__main__":
    absltest.main()
