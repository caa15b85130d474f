"""A run's adapter export read back (t5_training.adapter_export): evaluated and predicted with afterwards.

One short prompt-tuning run (setUpClass) serves every test of it: its best/ and final/ must
evaluate, under --do_train false, to the metrics the run reported for them, and its no-label
outputs must be warned about. LoRA's and a random base's exports are made without training.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import tempfile

import torch
from absl.testing import absltest, parameterized
from peft import PeftModel
from transformers import AutoModelForSeq2SeqLM

import fine_tune_t5
from t5_training import adapter_export, adapters, modeling, run_dir
from t5_training.config import parse_config
from t5_training.errors import UsageError
from tests import fixtures

PROMPT = ("--peft", "prompt_tuning", "--num_virtual_tokens", "5")
STEPS = 4  # of the prompt-tuning run, evaluated and saved every STEPS // 2


def _model_flag(args: list[str], model: str) -> list[str]:
    """`args` (fixtures.fine_tune_args) with --model_name_or_path `model` in place of --config_name."""
    at = args.index("--config_name")
    return args[:at] + ["--model_name_or_path", model] + args[at + 2:]


def _run(args: list[str]) -> tuple[dict, str]:
    """fine_tune_t5.main(args)'s results and what it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        results = fine_tune_t5.main(args)
    return results, err.getvalue()


def _rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


class _Exports(fixtures.SavedModelTestCase):
    """A saved tiny model (a user's pretrained base) and a folder for the runs."""

    def evaluate(self, model: str, predict: bool = False) -> tuple[str, dict, str]:
        """--do_train false (and --do_predict) with --model_name_or_path `model`: (its output dir, results, stderr)."""
        out = tempfile.mkdtemp(dir=self.tmp)
        args = fixtures.fine_tune_args(out, "--do_train", "false", *["--do_predict"] * predict)
        at = args.index("--tokenizer_name")  # as a user passes it: the export names its own
        return (out, *_run(_model_flag(args[:at] + args[at + 2:], model)))


class PromptTuningTest(_Exports):
    """One prompt-tuning run, evaluated twice, predicting the test rows at the end."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.out = os.path.join(cls.tmp, "run")
        args = fixtures.fine_tune_args(cls.out, "--max_steps", str(STEPS), "--save_steps", str(STEPS // 2),
                                       "--eval_steps", str(STEPS // 2),
                                       "--learning_rate", "1e-2", "--do_predict", *PROMPT)
        cls.results, cls.stderr = _run(_model_flag(args, cls.base))
        cls.evals = {row["step"]: row for row in run_dir.read_evals(cls.out)}

    def test_the_export_holds_the_adapter_and_evaluation_adds_the_prompt(self):
        final = os.path.join(self.out, "final")
        self.assertFalse(os.path.exists(os.path.join(final, "config.json")))  # nothing to merge into
        self.assertIsNotNone(run_dir.read_results(self.out))
        model = PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(self.base),
                                          os.path.join(final, adapters.ADAPTER_DIR)).eval()
        tokenizer = modeling.load_tokenizer(self.base)
        batch = tokenizer([f"sst2 sentence: {s}" for s in fixtures.sentences(12)], return_tensors="pt", padding=True)
        decoder_input_ids = torch.zeros((len(batch["input_ids"]), 3), dtype=torch.long)
        with torch.no_grad():
            # Evaluation's own path (the encoder once, then the base model's decoder) equals peft's forward.
            encoded, mask = adapters.encode(model, batch["input_ids"], batch["attention_mask"])
            self.assertEqual(mask.shape[1], batch["attention_mask"].shape[1] + 5)
            ours = adapters.base_model(model)(encoder_outputs=(encoded,), attention_mask=mask,
                                              decoder_input_ids=decoder_input_ids).logits
            peft_logits = model(**batch, decoder_input_ids=decoder_input_ids).logits
            torch.testing.assert_close(ours, peft_logits, rtol=1e-5, atol=1e-5)
            # ... and differs from the model without its prompt.
            plain = adapters.base_model(model)(**batch, decoder_input_ids=decoder_input_ids).logits
        self.assertFalse(torch.allclose(ours, plain, atol=1e-4))
        self.assertIn("loss", self.results["eval"])

    def test_outputs_that_name_no_label_are_warned_about_on_dev_and_test_rows(self):
        # A few steps teach the tiny model no label word: every dev and test output falls back.
        self.assertEqual(self.results["eval"]["no_label_share"], 1.0)
        lines = self.stderr.splitlines()
        dev = [line for line in lines if "dev outputs" in line]
        self.assertLen(dev, 1, self.stderr)
        self.assertStartsWith(dev[0], "WARNING: eval_results.json: 32 of 32 dev outputs (100.0%) name no label")
        submission = os.path.join(self.out, "submission", "SST-2.tsv")
        self.assertLen([line for line in lines if line.startswith(f"WARNING: {submission} is mostly the fallback")],
                       1, self.stderr)

    @parameterized.named_parameters(("best", "best"), ("final", "final"), ("final_adapter", "final/adapter"))
    def test_an_export_evaluates_to_the_metrics_the_run_reported_for_it(self, folder):
        reported = self.evals[self.results["eval"]["best_step"] if folder == "best" else STEPS]
        out, results, stderr = self.evaluate(os.path.join(self.out, folder), predict=True)
        self.assertEqual(set(results["eval"]), {k for k in reported if k != "step"})
        for key, value in results["eval"].items():
            self.assertAlmostEqual(value, reported[key], delta=1e-6 * abs(reported[key]), msg=key)
        self.assertIn("WARNING: eval_results.json: 32 of 32 dev outputs", stderr)
        self.assertEqual(results["predict"]["files"]["SST-2.tsv"]["no_label"],
                         self.results["predict"]["files"]["SST-2.tsv"]["no_label"])
        if folder != "best":  # the run predicted with its final model
            for name in ("predictions_validation.tsv", "predictions_test.tsv"):
                self.assertEqual(_rows(os.path.join(out, name)), _rows(os.path.join(self.out, name)), name)

    def test_best_and_final_hold_other_prompts(self):
        # Their base is the same: only the prompt each export holds can make their losses differ.
        self.assertNotEqual(self.results["eval"]["best_step"], STEPS)
        self.assertNotEqual(self.evals[STEPS // 2]["loss"], self.evals[STEPS]["loss"])

    def test_training_on_from_an_adapter_export_is_refused(self):
        args = fixtures.fine_tune_args(os.path.join(self.tmp, "again"), "--max_steps", "2", *PROMPT)
        export = os.path.join(self.out, "final")
        with self.assertRaisesRegex(UsageError, f"^--model_name_or_path {re.escape(export)} holds a prompt_tuning "
                                                "adapter, not a model to train: .*--do_train false.*"
                                                "--resume_from_checkpoint"):
            fine_tune_t5.main(_model_flag(args, export))


class LoadTest(_Exports):
    """Exports written directly (adapters.save_pretrained), as a run writes them, without a run."""

    def export(self, name: str, flags, *, random_base: bool = False) -> str:
        # Seeded: the adapter's draws below would otherwise follow whatever tests ran before in this process.
        torch.manual_seed(0)
        model = fixtures.tiny_model() if random_base else AutoModelForSeq2SeqLM.from_pretrained(self.base)
        config = parse_config(fine_tune_t5.FineTuneConfig, ["--config_name", fixtures.TINY_CONFIG, *flags])
        model = adapters.apply(model, config, random_base=random_base, log=lambda line: None)
        if not random_base:
            model.active_peft_config.base_model_name_or_path = self.base
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "lora_B" in param_name:  # B starts at zero: the adapter would change nothing
                    param.normal_(std=0.5)
        folder = os.path.join(self.tmp, self._testMethodName, name)
        adapters.save_pretrained(model, model.state_dict(), folder, final=folder)
        modeling.load_tokenizer(fixtures.tokenizer_dir()).save_pretrained(folder)
        return folder

    def test_a_lora_adapter_evaluates_as_its_merged_model(self):
        folder = self.export("lora", ["--peft", "lora", "--lora_target_modules", "q,v,wo"])
        # B is not zero, so the merged model is not the base: only the adapter on the base computes the same.
        merged = self.evaluate(folder)[1]["eval"]
        adapter = self.evaluate(os.path.join(folder, adapters.ADAPTER_DIR))[1]["eval"]
        # W + BA in one matrix rounds differently from W and BA applied apart: over 28 seeds the two losses
        # differed by up to 3.1e-6 of the loss, so 1e-5 of it; a merge that leaves the adapter out moves it by 0.30.
        self.assertAlmostEqual(adapter["loss"], merged["loss"], delta=1e-5 * merged["loss"])

    def test_a_random_base_is_read_from_beside_the_adapter_after_the_folder_moved(self):
        folder = self.export("random", PROMPT, random_base=True)
        before = self.evaluate(folder)[1]["eval"]
        moved = shutil.move(folder, os.path.join(self.tmp, "moved"))
        # adapter_config.json still names the base where it was; the copy beside the adapter is the one read.
        after = self.evaluate(moved)[1]["eval"]
        self.assertEqual(after["loss"], before["loss"])

    def test_a_base_that_cannot_be_loaded_is_one_line_naming_it(self):
        folder = self.export("lost", PROMPT)
        with open(os.path.join(folder, adapters.ADAPTER_DIR, "adapter_config.json"), encoding="utf-8") as f:
            saved = json.load(f)
        saved["base_model_name_or_path"] = os.path.join(self.tmp, "nowhere")
        with open(os.path.join(folder, adapters.ADAPTER_DIR, "adapter_config.json"), "w", encoding="utf-8") as f:
            json.dump(saved, f)
        with self.assertRaisesRegex(UsageError, "adapts the base model .*nowhere.*, which could not be loaded.*"
                                                "edit base_model_name_or_path in .*adapter_config.json"):
            self.evaluate(folder)

    @parameterized.named_parameters(("export", ""), ("adapter", adapters.ADAPTER_DIR))
    def test_find(self, sub):
        folder = self.export("find", PROMPT)
        self.assertEqual(adapter_export.find(os.path.join(folder, sub)), os.path.join(folder, adapters.ADAPTER_DIR))
        self.assertIsNone(adapter_export.find(self.base))
        self.assertIsNone(adapter_export.find("t5-small"))  # a hub name is not a folder here


if __name__ == "__main__":
    absltest.main()
