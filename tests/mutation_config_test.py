"""The mutation-testing settings (pyproject.toml, [tool.mutmut]) name files that exist, and every core
module has test files that tools/mutation.py finds (docs/development.md, "Mutation testing")."""
import os
import tomllib

from absl.testing import absltest

from tests import fixtures


def _settings() -> dict:
    with open(os.path.join(fixtures.REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["mutmut"]


class MutationSettingsTest(absltest.TestCase):

    def test_every_named_file_exists(self):
        settings = _settings()
        for path in settings["source_paths"] + settings["only_mutate"] + settings["also_copy"] \
                + settings["pytest_add_cli_args_test_selection"]:
            self.assertTrue(os.path.exists(os.path.join(fixtures.REPO, path)), path)

    def test_core_modules_are_copied_and_have_their_own_tests(self):
        settings = _settings()
        selected = set(settings["pytest_add_cli_args_test_selection"])
        for module in settings["only_mutate"]:
            # Mutated only if mutmut copies it (source_paths holds it or its folder).
            self.assertTrue(any(module == p or module.startswith(p.rstrip("/") + "/")
                                for p in settings["source_paths"]), module)
            own = f"tests/{os.path.splitext(os.path.basename(module))[0]}_test.py"
            self.assertIn(own, selected, module)

    def test_pytest_runs_without_xdist_workers(self):
        # The project's addopts start two xdist workers; mutmut needs the tests in its own process.
        self.assertEqual(_settings()["pytest_add_cli_args"], ["-n", "0"])


if __name__ == "__main__":
    absltest.main()
