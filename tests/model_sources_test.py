"""Names checked before transformers reads them, and loaders' errors as one line that names the fix."""
import json
import os
import types

from absl.testing import absltest, parameterized
from huggingface_hub.errors import StrictDataclassError
from transformers import BartConfig, T5Config

from t5_training import checkpoint, model_sources
from t5_training.errors import UsageError
from tests import fixtures


class LocalPathTest(fixtures.TempDirTestCase):

    @parameterized.parameters("/no-such-model", "./no-such-model", "../no-such-model", "~/no-such-model-t5-training", "runs/a/final",
                              "shape.json")
    def test_a_missing_name_that_can_only_be_a_path_is_refused(self, name):
        with self.assertRaisesWithLiteralMatch(UsageError, f"tokenizer {name!r}: no such file or folder; check the "
                                                           "path (a hub name has the form 'name' or 'org/name')"):
            model_sources.check_local_path(name, "tokenizer")

    @parameterized.parameters("t5-small", "google/t5-v1_1-small", "org/name/")
    def test_a_hub_name_is_left_to_the_hub(self, name):
        model_sources.check_local_path(name, "tokenizer")  # nothing here by that name, and no error

    def test_a_model_folder_is_a_model_whatever_else_it_holds(self):
        # config.json makes it a model, even beside checkpoint files or a run's final/ folder.
        for sub in ("", "final"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
            with open(os.path.join(self.dir, sub, "config.json"), "w", encoding="utf-8") as f:
                f.write("{}")
        for name in (checkpoint.MANIFEST, checkpoint.STATE_FILE):
            with open(os.path.join(self.dir, name), "w", encoding="utf-8") as f:
                f.write("{}")
        model_sources.check_local_path(self.dir, "--model_name_or_path")

    def test_a_checkpoint_and_a_run_folder_are_named_for_what_they_are(self):
        with open(os.path.join(self.dir, checkpoint.MANIFEST), "w", encoding="utf-8") as f:
            f.write("{}")
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"--model_name_or_path {self.dir!r} is a training checkpoint, not a model: continue its "
                            "run with --resume_from_checkpoint and that run's --output_dir, or start from the run's "
                            "final/ or best/ folder"):
            model_sources.check_local_path(self.dir, "--model_name_or_path")
        os.remove(os.path.join(self.dir, checkpoint.MANIFEST))
        for sub in ("best", "final"):
            os.makedirs(os.path.join(self.dir, sub))
            with open(os.path.join(self.dir, sub, "config.json"), "w", encoding="utf-8") as f:
                f.write("{}")
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"tokenizer {self.dir!r} is a run's output folder, not a model: pass its final/ or best/ "
                            f"folder, e.g. {os.path.join(self.dir, 'final')}"):
            model_sources.check_local_path(self.dir, "tokenizer")

    def test_a_final_folder_without_a_model_does_not_make_a_run_folder(self):
        os.makedirs(os.path.join(self.dir, "final"))
        model_sources.check_not_a_run_folder(self.dir, "--model_name_or_path")
        with open(os.path.join(self.dir, "final", "config.json"), "w", encoding="utf-8") as f:
            f.write("{}")
        with self.assertRaisesRegex(UsageError, "is a run's output folder, not a model: pass its final/ folder"):
            model_sources.check_not_a_run_folder(self.dir, "--model_name_or_path")


class ShippedShapeTest(fixtures.TempDirTestCase):
    """A shipped shape is found by its bare name, or as configs/NAME.json, from any working directory."""

    def setUp(self):
        super().setUp()
        cwd = os.getcwd()
        os.chdir(self.dir)  # no configs/ here: what resolves comes from the package's
        self.addCleanup(os.chdir, cwd)

    @parameterized.parameters("t5-small", "t5-small.json", "configs/t5-small.json")
    def test_found_outside_a_checkout(self, name):
        path = model_sources.resolve_config_name(name)
        self.assertEqual(os.path.basename(path), "t5-small.json")
        self.assertIn(os.path.dirname(path), model_sources.SHIPPED_CONFIG_DIRS)

    @parameterized.parameters("google/t5-v1_1-small", "other/t5-small.json", "t5-nope")
    def test_other_names_are_left_as_they_are(self, name):
        self.assertEqual(model_sources.resolve_config_name(name), name)

    def test_a_file_that_exists_wins(self):
        with open("t5-small.json", "w", encoding="utf-8") as f:
            f.write("{}")
        self.assertEqual(model_sources.resolve_config_name("t5-small.json"), "t5-small.json")


class ShapeTest(parameterized.TestCase):

    @parameterized.named_parameters(("fraction", "num_heads", 2.5), ("flag", "num_layers", True),
                                    ("text", "d_model", "64"))
    def test_a_size_that_is_not_a_whole_number_is_refused(self, field, value):
        # transformers' own T5Config refuses these types itself; a config class that ships with a model may not.
        config = types.SimpleNamespace(**{**T5Config(**fixtures.TINY_T5_SHAPE).to_dict(), field: value})
        with self.assertRaisesWithLiteralMatch(UsageError, f"--config_name x.json: {field} is {value!r}; it must be a "
                                                           "whole number of at least 1"):
            model_sources.check_shape(config, "x.json")

    def test_sizes_of_one_pass(self):
        model_sources.check_shape(types.SimpleNamespace(**{name: 1 for name in model_sources.SHAPE_FIELDS}), "ones")

    def test_a_shape_without_t5_fields_passes(self):
        model_sources.check_shape(BartConfig(d_model=16, encoder_layers=1, decoder_layers=1), "bart")


class LoadErrorTest(absltest.TestCase):

    def test_the_first_line_only_cut_to_300_characters(self):
        err = model_sources.load_error("model", "m", OSError("x" * 400 + "\nsecond line"))
        self.assertEqual(str(err), f"could not load model 'm': {'x' * 300}")

    def test_a_later_line_is_left_out(self):
        err = model_sources.load_error("model", "m", OSError("first line\nsecond line"))
        self.assertEqual(str(err), "could not load model 'm': first line")

    def test_a_field_type_error_keeps_the_type_from_its_second_line(self):
        err = model_sources.load_error("model", "m", StrictDataclassError("Validation error for field 'd_ff':\n"
                                                                         "  TypeError: expected int, got float"))
        self.assertEqual(str(err), "could not load model 'm': Validation error for field 'd_ff': TypeError: "
                                   "expected int, got float")

    def test_a_refusal_to_run_shipped_code_names_the_flag(self):
        refusal = ValueError("The repository /m contains custom code which must be executed to correctly load the "
                             "model. You can inspect the repository content at https://hf.co//m .\n"
                             "Please pass the argument `trust_remote_code=True` to allow custom code to be run.")
        self.assertEqual(str(model_sources.load_error("model", "/m", refusal)),
                         "model '/m' ships its own code (auto_map in its config), which runs only with "
                         "--trust_remote_code: read that code, and pass --trust_remote_code if you trust it")

    def test_an_error_without_a_message_is_named_by_its_kind(self):
        self.assertEqual(str(model_sources.load_error("tokenizer", "t", OSError())),
                         "could not load tokenizer 't': OSError")


class CodeBesideTest(fixtures.TempDirTestCase):

    def _config(self, values) -> str:
        path = os.path.join(self.dir, "shape.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(values, f)
        return path

    def test_a_config_file_that_ships_code_is_refused_naming_its_folder(self):
        path = self._config({"model_type": "t5", "auto_map": {"AutoConfig": "custom.Config"}})
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"--config_name {path!r} names code of its own (auto_map), which loads only from its "
                            f"folder: pass --config_name {self.dir} (the config as config.json beside its code), "
                            "and --trust_remote_code if you trust that code"):
            model_sources.check_code_beside(path)

    def test_a_bare_file_name_names_the_working_folder(self):
        self._config({"auto_map": {}})
        cwd = os.getcwd()
        os.chdir(self.dir)
        self.addCleanup(os.chdir, cwd)
        with self.assertRaisesRegex(UsageError, r"pass --config_name \. \(the config as config.json"):
            model_sources.check_code_beside("shape.json")

    def test_other_configs_are_left_to_transformers(self):
        model_sources.check_code_beside(self._config({"model_type": "t5"}))
        model_sources.check_code_beside(self.dir)  # a folder: transformers imports its code itself
        with open(os.path.join(self.dir, "broken.json"), "w", encoding="utf-8") as f:
            f.write('{"auto_map": ')
        model_sources.check_code_beside(os.path.join(self.dir, "broken.json"))
        model_sources.check_code_beside(os.path.join(self.dir, "missing", "shape.json"))


if __name__ == "__main__":
    absltest.main()
