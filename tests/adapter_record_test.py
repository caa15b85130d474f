"""What an adapter checkpoint records (t5_training.adapter_record), and which resumes it refuses, in what words.

The resume cases run fine_tune_t5.main on real checkpoints of the tiny model: a LoRA run and a
full fine-tuning run of one saved base model, and a LoRA run of a randomly initialised base. Each
case is also run on a copy whose train_state.json lacks the record, as checkpoints written before
it do, where it says what the tensors show.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

import torch
from absl.testing import absltest, parameterized

import fine_tune_t5
from t5_training import adapter_record, adapters, checkpoint, modeling
from t5_training.config import parse_config
from t5_training.errors import UsageError
from tests import fixtures

LORA_FLAGS = ("--peft", "lora", "--lora_alpha", "8")


def _tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    return modeling.load_model(None, fixtures.TINY_CONFIG, modeling.load_tokenizer(fixtures.tokenizer_dir()))


def _record(*flags, seed: int = 0) -> dict:
    config = parse_config(fine_tune_t5.FineTuneConfig, ["--config_name", fixtures.TINY_CONFIG, *flags])
    return adapter_record.describe(config, adapters.apply(_tiny_model(seed), config, random_base=True,
                                                          log=lambda _: None))


class DescribeTest(parameterized.TestCase):

    def test_lora_records_its_settings_as_peft_resolved_them_and_its_base(self):
        record = _record(*LORA_FLAGS, "--lora_dropout", "0.1", "--seed", "3")
        self.assertEqual(record["peft"], "lora")
        self.assertEqual(record["settings"], {"lora_target_modules": "k,o,q,v,wi,wo", "lora_r": 8, "lora_alpha": 8,
                                              "lora_dropout": 0.1, "use_dora": False})
        self.assertEqual({k: v for k, v in record["base"].items() if k != "fingerprint"},
                         {"model_name_or_path": None, "config_name": fixtures.TINY_CONFIG, "seed": 3})
        # The default targets and the same targets named are one record.
        self.assertEqual(_record(*LORA_FLAGS, "--lora_target_modules", "wo,wi,v,q,o,k")["settings"]
                         ["lora_target_modules"], "k,o,q,v,wi,wo")

    def test_the_fingerprint_is_the_frozen_weights(self):
        same = [_record("--peft", "ia3")["base"]["fingerprint"], _record(*LORA_FLAGS)["base"]["fingerprint"]]
        self.assertEqual(same[0], same[1])  # another adapter on the same base
        self.assertNotEqual(same[0], _record("--peft", "ia3", seed=1)["base"]["fingerprint"])

    def test_full_fine_tuning_records_the_method_alone(self):
        config = parse_config(fine_tune_t5.FineTuneConfig, ["--config_name", fixtures.TINY_CONFIG])
        self.assertEqual(adapter_record.describe(config, _tiny_model()), {"peft": "none"})


class CheckTest(parameterized.TestCase):
    """check_same_adapter on records: one line naming the setting, both values and the fix."""

    LORA = {"peft": "lora", "settings": {"lora_target_modules": "q,v", "lora_r": 8, "lora_alpha": 8,
                                         "lora_dropout": 0.0, "use_dora": False},
            "base": {"model_name_or_path": "runs/pt/final", "config_name": None, "seed": None, "fingerprint": "ab"}}

    def _with(self, settings=None, base=None):
        return {**self.LORA, "settings": {**self.LORA["settings"], **(settings or {})},
                "base": {**self.LORA["base"], **(base or {})}}

    def test_the_same_adapter_and_base_resume(self):
        adapter_record.check_same_adapter(self._with(), self._with(), "ckpt")
        # The base moved, its weights did not: resumes. An older checkpoint records nothing: resumes.
        adapter_record.check_same_adapter(self._with(), self._with(base={"model_name_or_path": "elsewhere"}), "ckpt")
        adapter_record.check_same_adapter({}, self._with(), "ckpt")
        # A prompt's starting values are not checked: the checkpoint's replace them.
        prompt = {"peft": "prompt_tuning", "settings": {"num_virtual_tokens": 5, "prompt_init": "vocab"}}
        adapter_record.check_same_adapter(prompt, {**prompt, "settings": {"num_virtual_tokens": 5,
                                                                           "prompt_init": "random"}}, "ckpt")

    @parameterized.named_parameters(
        ("alpha", {"lora_alpha": 64}, None, "was trained with --lora_alpha 8, but this run has --lora_alpha 64; "
                                            "resume it with --lora_alpha 8"),
        ("targets", {"lora_target_modules": "k,q,v"}, None,
         "was trained with --lora_target_modules q,v, but this run has --lora_target_modules k,q,v; resume it with "
         "--lora_target_modules q,v"),
        ("dora", {"use_dora": True}, None, "was trained with --use_dora false, but this run has --use_dora true"),
        ("dropout", {"lora_dropout": 0.1}, None, "was trained with --lora_dropout 0.0, but this run has "
                                                 "--lora_dropout 0.1"),
        ("another_base", None, {"model_name_or_path": "t5-small", "fingerprint": "cd"},
         "adapts the frozen base model of --model_name_or_path runs/pt/final, but this run's base "
         "(--model_name_or_path t5-small) has other weights; resume it with --model_name_or_path runs/pt/final"),
        ("a_changed_base", None, {"fingerprint": "cd"},
         "adapts the frozen base model of --model_name_or_path runs/pt/final (that model has changed since)"),
        ("another_seed", None, {"model_name_or_path": None, "config_name": "t5-tiny", "seed": 8, "fingerprint": "cd"},
         "adapts the frozen base model of --model_name_or_path runs/pt/final, but this run's base (--config_name "
         "t5-tiny drawn with --seed 8) has other weights"),
        # Without fingerprints (ZeRO-3 partitions the weights) the base's names decide.
        ("another_base_unfingerprinted", None, {"model_name_or_path": "t5-small", "fingerprint": None},
         "adapts the frozen base model of --model_name_or_path runs/pt/final, but"),
    )
    def test_a_difference_is_one_line(self, settings, base, said):
        with self.assertRaisesRegex(UsageError, "^checkpoint ckpt " + re.escape(said)) as cm:
            adapter_record.check_same_adapter(self._with(), self._with(settings, base), "ckpt")
        self.assertIn("or start a new run in another --output_dir", str(cm.exception))
        self.assertNotIn("\n", str(cm.exception))

    @parameterized.named_parameters(
        ("adapter_resumed_whole", LORA, {"peft": "none"},
         "was trained with --peft lora, but this run has --peft none; resume it with --peft lora "
         "--lora_target_modules q,v --lora_r 8 --lora_alpha 8 --lora_dropout 0.0 --use_dora false"),
        ("whole_resumed_as_adapter", {"peft": "none"}, LORA,
         "was trained with --peft none, but this run has --peft lora; resume it without --peft"),
    )
    def test_another_method_is_one_line(self, saved, now, said):
        with self.assertRaisesRegex(UsageError, "^checkpoint ckpt " + re.escape(said)):
            adapter_record.check_same_adapter(saved, now, "ckpt")


class ResumeTest(parameterized.TestCase):
    """Real checkpoints resumed with other flags: refused before anything loads, in one line, never 'damaged'."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()
        cls.bases = {}
        for name, seed in (("base", 0), ("other_base", 1)):
            cls.bases[name] = os.path.join(cls.tmp, name)
            _tiny_model(seed).save_pretrained(cls.bases[name])
            modeling.load_tokenizer(fixtures.tokenizer_dir()).save_pretrained(cls.bases[name])
        cls.runs = {}
        for name, flags, base in (("lora", LORA_FLAGS, "base"), ("full", (), "base"), ("random", LORA_FLAGS, None)):
            out, args = cls._args(name, *flags, base=base)
            fine_tune_t5.main(args)
            cls.runs[name] = out
            # The same checkpoint as an earlier version wrote it: no record in its train_state.json.
            legacy = f"{out}-legacy"
            shutil.copytree(out, legacy)
            state_file = os.path.join(checkpoint.checkpoint_dir(legacy, 2), checkpoint.STATE_FILE)
            with open(state_file, encoding="utf-8") as f:
                state = json.load(f)
            del state["adapter"]
            with open(state_file, "w", encoding="utf-8") as f:
                json.dump(state, f)
            manifest_file = os.path.join(os.path.dirname(state_file), checkpoint.MANIFEST)
            with open(manifest_file, encoding="utf-8") as f:
                manifest = json.load(f)
            manifest["files"][checkpoint.STATE_FILE] = os.path.getsize(state_file)
            with open(manifest_file, "w", encoding="utf-8") as f:
                json.dump(manifest, f)
            cls.runs[f"{name}-legacy"] = legacy

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    @classmethod
    def _args(cls, name, *flags, base="base", out=None):
        args = fixtures.fine_tune_args(out or os.path.join(cls.tmp, name), "--max_steps", "2", "--save_steps", "2",
                                       "--eval_steps", "2", *flags)
        if base:
            at = args.index("--config_name")
            args[at:at + 2] = ["--model_name_or_path", cls.bases[base]]
        return out or os.path.join(cls.tmp, name), args

    def _resume(self, run, *flags, base="base"):
        out = self.runs[run]
        _, args = self._args(run, "--max_steps", "4", "--resume_from_checkpoint", "auto", *flags, base=base, out=out)
        return out, args

    @parameterized.named_parameters(
        ("lora_without_peft", "lora", (), "base",
         "was trained with --peft lora, but this run has --peft none; resume it with --peft lora "
         "--lora_target_modules k,o,q,v,wi,wo --lora_r 8"),
        ("full_with_lora", "full", LORA_FLAGS, "base",
         "was trained with --peft none, but this run has --peft lora; resume it without --peft"),
        ("lora_with_other_targets", "lora", (*LORA_FLAGS, "--lora_target_modules", "q,k,v"), "base",
         "was trained with --lora_target_modules k,o,q,v,wi,wo, but this run has --lora_target_modules k,q,v; "
         "resume it with --lora_target_modules k,o,q,v,wi,wo"),
        ("lora_with_other_rank", "lora", (*LORA_FLAGS, "--lora_r", "4"), "base",
         "was trained with --lora_r 8, but this run has --lora_r 4"),
        ("lora_with_other_alpha", "lora", (*LORA_FLAGS[:2], "--lora_alpha", "64"), "base",
         "was trained with --lora_alpha 8, but this run has --lora_alpha 64; resume it with --lora_alpha 8"),
        ("lora_with_dora", "lora", (*LORA_FLAGS, "--use_dora"), "base",
         "was trained with --use_dora false, but this run has --use_dora true"),
        ("lora_on_another_base", "lora", LORA_FLAGS, "other_base",
         "adapts the frozen base model of --model_name_or_path {base}, but this run's base "
         "(--model_name_or_path {other_base}) has other weights; resume it with --model_name_or_path {base}"),
        ("random_base_with_another_seed", "random", (*LORA_FLAGS, "--seed", "8"), None,
         "adapts the frozen base model of --config_name {config} drawn with --seed 7, but this run's base "
         "(--config_name {config} drawn with --seed 8) has other weights"),
    )
    def test_another_adapter_or_base_is_refused_in_one_line(self, run, flags, base, said):
        said = said.format(config=fixtures.TINY_CONFIG, **self.bases)
        for legacy in ("", "-legacy"):
            # An earlier version's checkpoint shows its method, targets, rank and DoRA in its tensors;
            # alpha and the base it cannot show, and takes as this run's.
            if legacy and not re.search(r"--peft|--lora_target_modules|--lora_r|--use_dora", said):
                continue
            with self.subTest(legacy=bool(legacy)):
                out, args = self._resume(run + legacy, *flags, base=base)
                before = fixtures.snapshot(out)
                with self.assertRaises(UsageError) as cm:
                    fine_tune_t5.main(args)
                message = str(cm.exception)
                self.assertIn(f"checkpoint {checkpoint.list_checkpoints(out)[-1]} {said}", message)
                self.assertNotIn("damaged", message)
                self.assertNotIn("\n", message)
                self.assertEqual(fixtures.snapshot(out), before)

    def test_the_same_flags_resume(self):
        for run in ("lora", "lora-legacy"):
            with self.subTest(run=run):
                out, args = self._resume(run, *LORA_FLAGS)
                copy = f"{out}-again"
                shutil.copytree(out, copy)
                args[args.index("--output_dir") + 1] = copy
                fine_tune_t5.main(args)
                self.assertTrue(checkpoint.is_complete(checkpoint.checkpoint_dir(copy, 4)))


if __name__ == "__main__":
    absltest.main()
