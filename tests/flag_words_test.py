"""Tests for t5_training.flag_words, through parse_config: a --config file's flags, and list flags given twice."""
import json
import locale
import os

from absl.testing import absltest, parameterized

import fine_tune_t5
import pre_train_t5
from t5_training.config import parse_config
from t5_training.errors import UsageError
from tests import fixtures


def parse(*words):
    return parse_config(fine_tune_t5.FineTuneConfig, list(words))


class RepeatedListFlagTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("repeated", ["--train_file", "a.txt", "--train_file", "b.txt", "c.txt"], ["a.txt", "b.txt", "c.txt"]),
        ("equals_forms", ["--train_file=a.txt", "--seed", "3", "--train_file=b.txt"], ["a.txt", "b.txt"]),
        ("both_spellings", ["--train_file", "a.txt", "--train-file", "b.txt"], ["a.txt", "b.txt"]),
        # The first "=" ends the flag's name; the rest, "=" and all, is the value (sweep files are named so).
        ("equals_in_values", ["--train_file=lr=1e-4,seed=7.txt", "--train_file=b=c.txt"],
         ["lr=1e-4,seed=7.txt", "b=c.txt"]),
        ("once", ["--train_file", "a.txt", "b.txt"], ["a.txt", "b.txt"]))
    def test_a_list_flag_given_again_adds_to_it(self, words, files):
        # argparse keeps the last occurrence alone: a run would read part of its corpus, silently.
        config = parse_config(pre_train_t5.PreTrainConfig, [*words, "--validation_file", "v1", "--validation_file", "v2"])
        self.assertEqual((config.train_file, config.validation_file), (files, ["v1", "v2"]))

    def test_a_repeated_list_flag_without_values_is_refused(self):
        with self.assertRaisesRegex(UsageError, "argument --train_file/--train-file: expected at least one argument"):
            parse_config(pre_train_t5.PreTrainConfig, ["--train_file", "a.txt", "--train_file", "--seed", "1"])


class ConfigFileTest(fixtures.TempDirTestCase):

    def setUp(self):
        super().setUp()

    def _write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def _yaml(self):
        return self._write("run.yaml", "learning_rate: 1e-4\nseed: 7\noverwrite_output_dir: true\n"
                                       "lr_scheduler_type: cosine\nrun_name: null\ndataset_name: mrpc\n")

    def _json(self):
        return self._write("run.json", json.dumps({"learning_rate": 0.001, "seed": 3, "gradient_checkpointing": True,
                                                   "max_train_samples": 64}))

    def test_yaml(self):
        config = parse("--config", self._yaml())
        self.assertEqual((config.learning_rate, config.seed, config.lr_scheduler_type, config.dataset_name),
                         (1e-4, 7, "cosine", "mrpc"))
        self.assertIs(config.overwrite_output_dir, True)
        self.assertIsNone(config.run_name)  # null leaves the default

    def test_json(self):
        config = parse("--config=" + self._json())
        self.assertEqual((config.learning_rate, config.seed, config.max_train_samples), (0.001, 3, 64))
        self.assertIs(config.gradient_checkpointing, True)

    @parameterized.named_parameters(
        ("yaml_after", "_yaml", lambda path: ["--config", path, "--seed", "11"], 1e-4),
        ("yaml_before", "_yaml", lambda path: ["--seed=11", "--config", path], 1e-4),
        ("json_after", "_json", lambda path: ["--config=" + path, "--seed", "11"], 0.001),
    )
    def test_command_line_wins(self, make, words, learning_rate):
        config = parse(*words(getattr(self, make)()))
        self.assertEqual((config.seed, config.learning_rate), (11, learning_rate))

    def test_command_line_bool_overrides_file(self):
        config = parse("--config", self._yaml(), "--overwrite_output_dir", "false")
        self.assertIs(config.overwrite_output_dir, False)

    @parameterized.named_parameters(
        ("yaml", "bad.yaml", "learning_rte: 1e-4\nseed: 3\n"),
        ("json", "bad.json", '{"seed": 3, "learning_rte": 0.0001}'),
    )
    def test_misspelt_key_in_file(self, name, text):
        path = self._write(name, text)
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"unknown flag --learning_rte in --config file {path}; did you mean --learning_rate?"):
            parse("--config", path)

    def test_a_misspelt_flag_beside_the_file_is_not_blamed_on_it(self):
        with self.assertRaisesWithLiteralMatch(UsageError, "unknown flag --sed; did you mean --seed?"):
            parse("--config", self._yaml(), "--sed", "3")

    def test_two_files_are_refused_by_name(self):
        a, b = self._yaml(), self._json()
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"--config given 2 times ({a!r}, {b!r}); pass one file, and give other flags on the "
                            "command line, which win over the file's"):
            parse("--config", a, "--config=" + b)

    def test_a_file_naming_another_is_refused(self):
        path = self._write("outer.yaml", f"config: {self._yaml()}\nseed: 3\n")
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"--config file {path} names another with config:; merge the two into one file"):
            parse("--config", path)

    def test_a_list_for_a_flag_of_one_value_names_the_flag_and_the_file(self):
        path = self._write("run.yaml", "seed: [1, 2]\n")
        with self.assertRaisesWithLiteralMatch(UsageError,
                                               f"--config file {path}: seed is a list, but --seed takes one value"):
            parse("--config", path)

    def test_help_lists_the_flag(self):
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit):
            parse("--help")
        self.assertRegex(out.getvalue(), r"--config FILE\s+A YAML or JSON file of flag: value pairs, read first")

    @parameterized.named_parameters(
        ("missing", None, r"--config file '.*nope.yaml' not found"),
        ("not_a_mapping", "- 1\n- 2\n", r"must hold a mapping of flag: value pairs"),
        ("bad_yaml", "a: [\n", r"is not valid YAML"),
        ("bad_value", "per_device_train_batch_size: 0\n", r"--per_device_train_batch_size must be at least 1"),
    )
    def test_bad_file(self, text, message):
        path = os.path.join(self.dir, "nope.yaml") if text is None else self._write("x.yaml", text)
        with self.assertRaisesRegex(UsageError, message):
            parse("--config", path)

    def test_bad_json(self):
        with self.assertRaisesRegex(UsageError, r"is not valid JSON"):
            parse("--config", self._write("x.json", '{"seed": 3,'))

    def test_path_holding_equals_signs(self):
        # --config=PATH splits at the first "=": the rest is the path, "=" and all (sweep files are named so).
        path = self._write("lr=1e-4,seed=7.yaml", "seed: 7\n")
        self.assertEqual(parse("--config=" + path).seed, 7)

    def test_json_file_is_read_as_json(self):
        # YAML would read this file; a .json one is JSON's, and the message quotes its parser's first line.
        path = self._write("run.json", "seed: 3\n")
        with self.assertRaises(UsageError) as raised:
            parse("--config", path)
        self.assertEqual(str(raised.exception),
                         f"--config file {path} is not valid JSON: Expecting value: line 1 column 1 (char 0)")

    def test_list_values_become_one_flag_with_several_words(self):
        path = self._write("run.yaml", "train_file: [a.txt, b.txt]\n")
        config = parse_config(pre_train_t5.PreTrainConfig, ["--config", path])
        self.assertEqual(config.train_file, ["a.txt", "b.txt"])

    def test_the_command_lines_list_replaces_the_files(self):
        path = self._write("run.yaml", "train_file: [a.txt, b.txt]\n")
        config = parse_config(pre_train_t5.PreTrainConfig, ["--train_file", "c.txt", "--config", path,
                                                              "--train_file", "d.txt"])
        self.assertEqual(config.train_file, ["c.txt", "d.txt"])

    def test_yaml_booleans_are_written_as_the_command_line_spells_them(self):
        # YAML reads `yes` as a boolean: it arrives as "true"; other text keeps its case.
        path = self._write("run.yaml", "run_name: yes\noutput_dir: Runs/MyRun\n")
        config = parse("--config", path)
        self.assertEqual((config.run_name, config.output_dir), ("true", "Runs/MyRun"))

    def test_file_is_read_as_utf8_whatever_the_locale(self):
        path = self._write("run.yaml", "run_name: caf\u00e9 \u2013 r\u00e9sum\u00e9\n")
        old = locale.setlocale(locale.LC_CTYPE)
        try:
            locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale, where open() would default to ASCII
            config = parse("--config", path)
        finally:
            locale.setlocale(locale.LC_CTYPE, old)
        self.assertEqual(config.run_name, "caf\u00e9 \u2013 r\u00e9sum\u00e9")

    def test_config_without_path(self):
        with self.assertRaisesRegex(UsageError, r"--config file '' not found"):
            parse("--config")


if __name__ == "__main__":
    absltest.main()
