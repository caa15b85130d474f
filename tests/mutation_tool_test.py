"""tools/mutation.py's command line: the test files named with --tests and the modules to mutate
stay apart (docs/development.md, "Mutation testing")."""
import importlib.util
import os
import tempfile
from unittest import mock

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


def _write_a_tokenizer(texts, path, vocab_size):
    """What the cache sees of training (the real one takes 10-20 s): a folder with a tokenizer in it."""
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(str(vocab_size))


class FixtureCacheTest(absltest.TestCase):
    """Each mutant's tests start a new process: the fixture tokenizer is trained once, then read back."""

    def test_a_kept_tokenizer_is_reused_and_not_trained_again(self):
        from t5_training.tools import tokenizer

        build = fixtures.tokenizer_dir.__wrapped__  # past the per-process lru_cache, as a new process is
        with tempfile.TemporaryDirectory() as cache, mock.patch.dict(os.environ, T5_TRAINING_FIXTURE_CACHE=cache):
            with mock.patch.object(tokenizer, "train_tokenizer", side_effect=_write_a_tokenizer) as train:
                first, again = build(1000), build(1000)
            self.assertEqual(train.call_count, 1)
            self.assertEqual((os.path.dirname(first), again), (cache, first))
            self.assertTrue(os.path.isfile(os.path.join(first, "tokenizer.json")))
            self.assertEqual(os.listdir(cache), [os.path.basename(first)])  # no half-written folder left
            self.assertNotEqual(build(1200), first)  # another vocabulary, another tokenizer
