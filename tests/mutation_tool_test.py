"""tools/mutation.py's command line: the test files named with --tests and the modules to mutate
stay apart (docs/development.md, "Mutation testing")."""
import importlib.util
import os

from absl.testing import absltest

from tests import fixtures


def _tool():
    """tools/ is no package: the script is loaded from its path, as `python tools/mutation.py` runs it."""
    path = os.path.join(fixtures.REPO, "tools", "mutation.py")
    spec = importlib.util.spec_from_file_location("mutation_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ParseArgsTest(absltest.TestCase):

    def test_tests_before_the_module_leave_the_module_to_mutate(self):
        args = _tool().parse_args(["--tests", "tests/x_test.py", "t5_training/x.py"])
        self.assertEqual(args.tests, ["tests/x_test.py"])
        self.assertEqual(args.files, ["t5_training/x.py"])

    def test_tests_repeat_one_file_per_flag(self):
        args = _tool().parse_args(["--tests", "tests/a_test.py", "--tests", "tests/b_test.py",
                                   "--not-killed", "t5_training/a.py", "t5_training/b.py"])
        self.assertEqual(args.tests, ["tests/a_test.py", "tests/b_test.py"])
        self.assertEqual(args.files, ["t5_training/a.py", "t5_training/b.py"])
        self.assertTrue(args.not_killed)

    def test_without_tests_each_module_finds_its_own(self):
        args = _tool().parse_args(["t5_training/step.py", "t5_training/losses.py"])
        self.assertIsNone(args.tests)
        self.assertEqual(args.files, ["t5_training/step.py", "t5_training/losses.py"])


if __name__ == "__main__":
    absltest.main()
