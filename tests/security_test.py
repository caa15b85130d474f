"""Security defaults: no remote code unless asked, safetensors exports, no pickle loading, no secrets in trackers."""
from __future__ import annotations

import ast
import dataclasses
import glob
import json
import os
import shutil
import typing
from unittest import mock

from absl.testing import absltest, parameterized
from transformers import AutoConfig

import fine_tune_t5
from t5_training import modeling, runtime
import pre_train_t5
from t5_training.errors import UsageError
from t5_training.config import (REDACTED, ModelConfig, TrainingConfig, config_for_trackers, is_secret_name,
                                parse_config)
from tests import fixtures


def _project_sources() -> list[str]:
    files = glob.glob(os.path.join(fixtures.REPO, "*.py")) + glob.glob(os.path.join(fixtures.REPO, "t5_training",
                                                                                    "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(fixtures.REPO, "benchmarks", "*.py"))
    return sorted(files)


class NoPickleLoadingTest(absltest.TestCase):

    def test_every_torch_load_passes_weights_only_true(self):
        calls = []
        for path in _project_sources():
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and \
                        getattr(node.func.value, "id", None) == "torch":
                    safe = any(k.arg == "weights_only" and getattr(k.value, "value", None) is True
                               for k in node.keywords)
                    calls.append((os.path.relpath(path, fixtures.REPO), node.lineno, safe))
        self.assertEqual([c for c in calls if not c[2]], [])

    def test_the_scan_sees_the_project(self):
        names = {os.path.relpath(p, fixtures.REPO) for p in _project_sources()}
        self.assertContainsSubset({"fine_tune_t5.py", "pre_train_t5.py", "t5_training/checkpoint.py"}, names)

    def test_scheduler_is_not_a_pickled_custom_object(self):
        # accelerate unpickles registered objects with weights_only=False; nothing may be registered.
        for path in _project_sources():
            with open(path, encoding="utf-8") as f:
                self.assertNotIn("register_for_checkpointing", f.read(), path)


class RemoteCodeTest(absltest.TestCase):

    def test_off_by_default(self):
        self.assertFalse(ModelConfig().trust_remote_code)
        self.assertFalse(fine_tune_t5.FineTuneConfig().trust_remote_code)


class ShippedCodeTest(fixtures.TempDirTestCase):
    """A model or tokenizer folder whose config names code of its own (auto_map) runs that code only
    with --trust_remote_code; without it, one line names the flag, and nothing of it is imported."""

    def setUp(self):
        super().setUp()
        self.model_dir = os.path.join(self.dir, "model")
        self.tokenizer_dir = shutil.copytree(fixtures.tokenizer_dir(), os.path.join(self.dir, "tokenizer"))
        os.makedirs(self.model_dir)
        with open(os.path.join(self.model_dir, "custom_t5.py"), "w", encoding="utf-8") as f:
            f.write(CUSTOM_MODEL)
        with open(fixtures.TINY_CONFIG, encoding="utf-8") as f:
            shape = json.load(f)
        self._write(os.path.join(self.model_dir, "config.json"), {**shape, "model_type": "custom-t5", "auto_map": {
            "AutoConfig": "custom_t5.CustomT5Config", "AutoModelForSeq2SeqLM": "custom_t5.CustomT5"}})
        with open(os.path.join(self.tokenizer_dir, "custom_tokenizer.py"), "w", encoding="utf-8") as f:
            f.write(CUSTOM_TOKENIZER)
        settings = os.path.join(self.tokenizer_dir, "tokenizer_config.json")
        with open(settings, encoding="utf-8") as f:
            # With a class of transformers' own named, transformers would load that one and ignore the code.
            self._write(settings, {**json.load(f), "tokenizer_class": "CustomTokenizer", "auto_map": {
                "AutoTokenizer": [None, "custom_tokenizer.CustomTokenizer"]}})

    @staticmethod
    def _write(path, values):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(values, f)

    def _refused(self, what, name):
        return self.assertRaisesWithLiteralMatch(
            UsageError, f"{what} {name!r} ships its own code (auto_map in its config), which runs only with "
                        "--trust_remote_code: read that code, and pass --trust_remote_code if you trust it")

    def test_a_model_shape_built_from_scratch(self):
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        with self._refused("model", self.model_dir):
            modeling.load_model(None, self.model_dir, tokenizer)
        # Before a trusted load of the model registers its class, for this process, as transformers' own.
        with self.assertRaisesRegex(ValueError, "trust_remote_code=True"):
            modeling.fresh_model(AutoConfig.from_pretrained(self.model_dir, trust_remote_code=True))
        model = modeling.load_model(None, self.model_dir, tokenizer, trust_remote_code=True)
        self.assertEqual(type(model).__name__, "CustomT5")
        model.save_pretrained(os.path.join(self.dir, "trained"))  # the code is saved beside the weights

        trained = os.path.join(self.dir, "trained")
        with self._refused("model", trained):
            modeling.load_model(trained, None, tokenizer)
        self.assertEqual(type(modeling.load_model(trained, None, tokenizer, trust_remote_code=True)).__name__,
                         "CustomT5")

    def test_a_tokenizer(self):
        with self._refused("tokenizer", self.tokenizer_dir):
            modeling.load_tokenizer(self.tokenizer_dir)
        tokenizer = modeling.load_tokenizer(self.tokenizer_dir, trust_remote_code=True)
        self.assertEqual(type(tokenizer).__name__, "CustomTokenizer")

    def test_the_flag_of_a_run_reaches_both_loaders(self):
        flags = parse_config(fine_tune_t5.FineTuneConfig, ["--config_name", self.model_dir,
                                                            "--tokenizer_name", self.tokenizer_dir])
        with self._refused("tokenizer", self.tokenizer_dir):
            modeling.load_tokenizer_and_model(flags)
        tokenizer, model = modeling.load_tokenizer_and_model(dataclasses.replace(flags, trust_remote_code=True))
        self.assertEqual((type(tokenizer).__name__, type(model).__name__), ("CustomTokenizer", "CustomT5"))
        with self._refused("model", self.model_dir):
            modeling.load_tokenizer_and_model(dataclasses.replace(flags, tokenizer_name=fixtures.tokenizer_dir()))


CUSTOM_MODEL = """from transformers import T5Config, T5ForConditionalGeneration


class CustomT5Config(T5Config):
    model_type = "custom-t5"


class CustomT5(T5ForConditionalGeneration):
    config_class = CustomT5Config
"""

CUSTOM_TOKENIZER = """from transformers import T5Tokenizer


class CustomTokenizer(T5Tokenizer):
    pass
"""


class ExportFormatTest(fixtures.TempDirTestCase):

    def test_models_are_saved_as_safetensors_only(self):
        out = os.path.join(self.dir, "run")
        fine_tune_t5.main(fixtures.fine_tune_args(out, "--max_steps", "2", "--save_steps", "1"))
        for folder in ("final", "best"):
            files = os.listdir(os.path.join(out, folder))
            self.assertIn("model.safetensors", files)
            self.assertEqual([f for f in files if f.endswith((".bin", ".pt", ".pth", ".pkl"))], [])
        checkpoint_files = os.listdir(os.path.join(out, "step-000002"))
        self.assertIn("model.safetensors", checkpoint_files)


class TrackerSecretsTest(parameterized.TestCase):

    def test_secret_values_and_secret_named_fields_are_redacted(self):
        import dataclasses

        @dataclasses.dataclass(frozen=True)
        class WithToken(TrainingConfig):
            hub_token: str | None = None

        env = {"WANDB_API_KEY": "0123456789abcdef", "HF_TOKEN": "hf_secretvalue", "HOME": "/home/someone"}
        config = WithToken(run_name="lr-sweep-0123456789abcdef", hub_token="hf_other", output_dir="/home/someone/x")
        logged = config_for_trackers(config, environ=env)
        self.assertEqual(logged["run_name"], REDACTED)
        self.assertEqual(logged["hub_token"], REDACTED)
        self.assertEqual(logged["output_dir"], "/home/someone/x")  # HOME is not a secret
        self.assertEqual(logged["learning_rate"], config.resolved_learning_rate)
        self.assertNotIn("0123456789abcdef", repr(logged))

    def test_list_flags_are_sent_as_one_string_with_secrets_redacted(self):
        import dataclasses

        @dataclasses.dataclass(frozen=True)
        class WithFiles(TrainingConfig):
            train_file: list[str] | None = None

        config = WithFiles(train_file=["a.txt", "b-0123456789abcdef.txt"])
        logged = config_for_trackers(config, environ={"WANDB_API_KEY": "0123456789abcdef"})
        self.assertEqual(logged["train_file"], f"a.txt, {REDACTED}")

    @parameterized.named_parameters(
        # An environment variable ending in TOKEN is a secret whoever owns it (a flag named so is not).
        ("ci_job_token", {"CI_JOB_TOKEN": "glcbt-0123456789"}, "glcbt-0123456789", True),
        # Values of 8 characters or more are looked for; shorter ones would match ordinary text.
        ("eight_characters", {"HF_TOKEN": "hf_12345"}, "run-hf_12345", True),
        ("seven_characters", {"HF_TOKEN": "hf_1234"}, "run-hf_1234", False),
    )
    def test_values_of_secret_environment_variables_are_redacted(self, environ, run_name, redacted):
        logged = config_for_trackers(TrainingConfig(run_name=run_name), environ=environ)
        self.assertEqual(logged["run_name"], REDACTED if redacted else run_name)

    def test_unset_secret_named_fields_are_sent_as_they_are(self):
        import dataclasses

        @dataclasses.dataclass(frozen=True)
        class WithTokens(TrainingConfig):
            hub_token: str | None = None
            use_auth_token: bool = False

        # Empty, None and False hold no secret: the tracker shows them unset; True is redacted like any value.
        logged = config_for_trackers(WithTokens(hub_token=""), environ={})
        self.assertEqual((logged["hub_token"], logged["use_auth_token"]), ("", False))
        logged = config_for_trackers(WithTokens(use_auth_token=True), environ={})
        self.assertEqual((logged["hub_token"], logged["use_auth_token"]), (None, REDACTED))

    def test_trackers_get_the_redacted_config(self):
        accelerator = mock.Mock()
        config = TrainingConfig(report_to="tensorboard", run_name="x")
        with mock.patch.dict(os.environ, {"WANDB_API_KEY": "x" * 40}):
            runtime.init_trackers(accelerator, TrainingConfig(report_to="tensorboard", run_name="key-" + "x" * 40),
                                  "project")
        sent = accelerator.init_trackers.call_args.kwargs["config"]
        self.assertEqual(sent["run_name"], REDACTED)
        self.assertEqual(config_for_trackers(config, environ={})["run_name"], "x")


class SecretNameTest(parameterized.TestCase):

    @parameterized.parameters("hub_token", "push_to_hub_token", "token", "auth_token", "wandb_api_key", "api_key",
                              "apikey", "openai_api_key", "db_password", "client_secret", "private_key",
                              "aws_secret_access_key", "credentials_file")
    def test_secret_flag_names(self, name):
        self.assertTrue(is_secret_name(name))

    @parameterized.parameters("tokenizer_name", "mode_token", "num_virtual_tokens", "max_tokens", "pad_token_id",
                              "keyword", "key_column", "tokens_per_second", "sentinel_token")
    def test_ordinary_flag_names(self, name):
        self.assertFalse(is_secret_name(name))

    @parameterized.parameters(("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("CI_JOB_TOKEN", True),
                              ("WANDB_API_KEY", True), ("TOKENIZERS_PARALLELISM", False), ("HOME", False))
    def test_environment_names(self, name, secret):
        self.assertEqual(is_secret_name(name, environment=True), secret)

    @parameterized.parameters("", "_", "__", "--")
    def test_names_without_words(self, name):
        # The shell's `_` (the last command's path) is in many environments: no secret.
        self.assertFalse(is_secret_name(name))
        self.assertFalse(is_secret_name(name, environment=True))

    @parameterized.parameters(fine_tune_t5.FineTuneConfig, pre_train_t5.PreTrainConfig)
    def test_no_flag_of_either_script_is_redacted(self, config_class):
        import dataclasses

        # Every free-text flag set to a value, the others left at their defaults (non-empty ones
        # included), then sent as the trackers get it.
        hints = typing.get_type_hints(config_class)
        text = [field.name for field in dataclasses.fields(config_class) if hints[field.name] in (str, str | None)]
        self.assertContainsSubset(["tokenizer_name", "output_dir"], text)
        # The two sources of a model are refused together (ModelConfig.check_model_flags): one each time.
        for left_out in ("config_name", "model_name_or_path"):
            config = config_class(**{name: f"value-of-{name}" for name in text if name != left_out})
            logged = config_for_trackers(config, environ={"HF_TOKEN": "hf_secretvalue"})
            self.assertEqual([name for name, value in logged.items() if value == REDACTED], [])
            self.assertEqual(logged["tokenizer_name"], "value-of-tokenizer_name")


if __name__ == "__main__":
    absltest.main()
