"""Every bad input ends with one line that names the problem and the fix, exit code 2, and no change on disk.

Each case runs the real script's entry in a process of its own (forked from one that imported
the scripts once: tests/cli_batch.py), so the one-line promise also covers whatever the
libraries print to stderr. The output dir already holds an earlier run (a checkpoint, results)
and, except where the case is about it, the run is given --overwrite_output_dir: even then a
refused run must delete or write nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from absl.testing import absltest, parameterized
from transformers import T5TokenizerFast

from tests import cli_batch, fixtures

FINE_TUNE, PRE_TRAIN = "fine_tune_t5", "pre_train_t5"  # the scripts, as tests/cli_batch.py imports them


def _write(path: str, content: str | bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    return path


def _earlier_run(out: str) -> None:
    """What a finished run leaves: a complete checkpoint, an export, results, and a user's note."""
    step = os.path.join(out, "step-000002")
    _write(os.path.join(step, "model.safetensors"), b"weights")
    _write(os.path.join(step, "checkpoint.json"),
           json.dumps({"step": 2, "files": {"model.safetensors": len(b"weights")}}))
    _write(os.path.join(out, "eval_results.json"), '{"accuracy": 81.0}')
    _write(os.path.join(out, "best", "config.json"), '{"model_type": "t5"}')
    _write(os.path.join(out, "notes.txt"), "earlier results\n")


# (name, script, flags, the problem the line names, the fix it names)
CASES = [
    ("unknown_benchmark", FINE_TUNE, ["--benchmark", "superglu"], "unknown --benchmark 'superglu'",
     "known: embedded, glue, seq2seq"),
    ("unknown_task", FINE_TUNE, ["--dataset_name", "sst3"], "unknown --dataset_name 'sst3'", "known: cola, mnli"),
    ("missing_column", FINE_TUNE, ["--train_file", "{f}/no_label.csv", "--validation_file", "{f}/no_label.csv"],
     "no column 'label'", "columns found: sentence, score"),
    ("label_outside_words", FINE_TUNE, ["--train_file", "{f}/bad_label.csv", "--validation_file",
                                        "{f}/bad_label.csv"], "row 2: label 'great'", "0 or 'negative'"),
    ("empty_split", FINE_TUNE, ["--train_file", "{f}/header_only.csv", "--validation_file",
                                "{f}/bad_label.csv"], "header_only.csv has no rows", "a file with rows"),
    ("non_utf8", FINE_TUNE, ["--data_dir", "{f}/latin1"], "train.tsv is not UTF-8: line 3 has byte 0xe9",
     "re-encode it as UTF-8"),
    ("empty_label", FINE_TUNE, ["--train_file", "{f}/empty_label.csv", "--validation_file",
                                "{f}/empty_label.csv"], "row 2: label ''", "fix the row"),
    ("nan_label", FINE_TUNE, ["--dataset_name", "stsb", "--train_file", "{f}/nan_score.csv",
                              "--validation_file", "{f}/nan_score.csv"], "row 2: label 'nan' is not a number",
     "fix or remove the row"),
    ("misspelt_flag", FINE_TUNE, ["--learning_rte", "1e-3"], "unknown flag --learning_rte",
     "did you mean --learning_rate?"),
    ("non_empty_output_dir", FINE_TUNE, [], "is not empty", "pass --overwrite_output_dir"),
    ("no_sentinels", PRE_TRAIN, ["--tokenizer_name", "{f}/no_sentinels"], "has no sentinel tokens",
     "python -m t5_training.tokenizer"),
    ("longer_than_positions", FINE_TUNE, ["--config_name", "{f}/bart.json", "--max_source_length", "64"],
     "--max_source_length 64 is longer than this model's 32 position embeddings", "--max_source_length 32"),
    ("missing_data_dir", FINE_TUNE, ["--data_dir", "{f}/nowhere"], "is not a directory",
     "point it at the folder with the task's files"),
    ("missing_test_file", FINE_TUNE, ["--data_dir", "{f}/no_test", "--do_predict"],
     "--do_predict needs the test file {f}/no_test/test.tsv, which is not there",
     "put the task's test.tsv in --data_dir, or drop --do_predict"),
    ("evaluate_without_a_model", FINE_TUNE, ["--do_train", "false", "--do_predict"],
     "--do_train false evaluates a trained model", "pass it as --model_name_or_path"),
    # A prompt-tuned export whose adapter_config.json names a base that is not there.
    ("adapter_base_missing", FINE_TUNE, ["--do_train", "false", "--model_name_or_path", "{f}/lost_base"],
     "the adapter in {f}/lost_base/adapter adapts the base model '{f}/nowhere', which could not be loaded",
     "edit base_model_name_or_path in"),
    ("adapter_with_freezing", FINE_TUNE, ["--peft", "prompt_tuning", "--freeze_encoder"],
     "--freeze_encoder with --peft prompt_tuning", "drop --freeze_encoder"),
    ("adapter_target_missing", FINE_TUNE, ["--peft", "lora", "--lora_target_modules", "q,query"],
     "no linear layer named 'query'", "it has k, o, q, v, wi, wo"),
    ("adapter_on_tied_output_layer", FINE_TUNE, ["--peft", "lora", "--lora_target_modules", "q,lm_head"],
     "--lora_target_modules names lm_head, this model's output layer, which shares its weight with the input "
     "embedding", "drop lm_head and name only k, o, q, v, wi, wo"),
    ("incomplete_checkpoint", FINE_TUNE, ["--resume_from_checkpoint", "{out}/step-000004"],
     "step-000004 is incomplete or damaged", "pass an earlier checkpoint or 'auto'"),
    ("damaged_checkpoint", FINE_TUNE, ["--resume_from_checkpoint", "{out}/step-000002"],
     "step-000002 could not be loaded", "pass an earlier checkpoint"),
    ("mixture_unknown_task", FINE_TUNE, ["--dataset_name", "sst2,colaa", "--data_dir", "{glue}"],
     "unknown task 'colaa' in --dataset_name 'sst2,colaa'", "known: cola, sst2"),
    # The made GLUE folder holds four of GLUE's nine task folders: the other five are named.
    ("mixture_missing_folder", FINE_TUNE, ["--dataset_name", "all", "--data_dir", "{glue}"],
     "has no folder for qqp (QQP/), mnli (MNLI/), qnli (QNLI/), rte (RTE/), wnli (WNLI/)",
     "leave those tasks out of --dataset_name"),
    ("mixture_temperature_not_positive", FINE_TUNE, ["--dataset_name", "sst2,cola", "--data_dir",
                                                     "{glue}", "--mixing", "temperature",
                                                     "--mixing_temperature", "0"],
     "--mixing_temperature must be positive, got 0.0", "T5 used 2, 8 and 256"),
    ("mixture_flags_with_one_task", FINE_TUNE, ["--mixing_cap", "100"],
     "--mixing_cap mixes several tasks, and --dataset_name names one (sst2)", "drop the mixture flags"),
    ("mode_token_not_in_vocabulary", FINE_TUNE, ["--mode_token", "[NLX]"],
     "--mode_token '[NLX]' is not one token of this tokenizer", "[NLU], [NLG] and [S2S]"),
    ("denoisers_unknown_key", PRE_TRAIN, ["--denoisers", "{f}/unknown_key.yaml"],
     "--denoisers {f}/unknown_key.yaml: mixture entry 0 (short): unknown keys ['span']",
     "the keys are name, kind, mean_noise_span_length, noise_density, mode_token, rate"),
    ("denoisers_rate_zero", PRE_TRAIN, ["--denoisers", "{f}/rate_zero.yaml"],
     "--denoisers {f}/rate_zero.yaml: mixture entry 1 (lm): rate must be a number > 0", "got 0"),
    ("denoisers_not_yaml", PRE_TRAIN, ["--denoisers", "{f}/not_yaml.yaml"], "--denoisers {f}/not_yaml.yaml: ",
     "while parsing"),
    ("denoisers_missing_file", PRE_TRAIN, ["--denoisers", "{f}/nowhere.yaml"],
     "--denoisers {f}/nowhere.yaml: No such file or directory", "pass a YAML file that lists the denoisers"),
    ("denoisers_with_prefix_lm", PRE_TRAIN, ["--objective", "prefix_lm", "--denoisers", "{f}/unknown_key.yaml"],
     "--denoisers lists a mixture of denoisers, which --objective prefix_lm is not", "drop --objective"),
    ("ul2_with_span_noise", PRE_TRAIN, ["--objective", "ul2", "--noise_density", "0.3"],
     "--noise_density and --mean_noise_span_length are span corruption's", "list them in a --denoisers file"),
    # Flags that would do nothing beside the others given.
    ("lora_flag_without_peft", FINE_TUNE, ["--lora_r", "16"], "--lora_r applies to --peft lora",
     "add --peft lora, or drop it"),
    ("patience_without_evaluations", FINE_TUNE, ["--early_stopping_patience", "2"],
     "--early_stopping_patience 2 counts evaluations without improvement", "set --eval_steps N"),
    # Two sources of the model's shape: the pretrained one would win and the config be ignored.
    ("pretrained_and_config", FINE_TUNE, ["--model_name_or_path", "{f}/no_model", "--config_name", "t5-small"],
     "--model_name_or_path {f}/no_model loads a pretrained model with its own shape, and --config_name t5-small "
     "shapes a model trained from scratch", "pass one of them"),
    ("pretrained_and_config_pretraining", PRE_TRAIN, ["--model_name_or_path", "{f}/no_model"],
     "and --config_name " + fixtures.TINY_CONFIG + " shapes a model trained from scratch", "pass one of them"),
    ("mixing_without_training", FINE_TUNE, ["--do_train", "false", "--model_name_or_path", "{f}/no_model",
                                            "--dataset_name", "sst2,cola", "--data_dir", "{glue}",
                                            "--mixing_cap", "100"],
     "--mixing_cap sets how training draws rows from a mixture's tasks", "drop it"),
    ("span_noise_with_prefix_lm", PRE_TRAIN, ["--objective", "prefix_lm", "--noise_density", "0.3"],
     "--noise_density is span corruption's; --objective prefix_lm corrupts no spans",
     "use --objective span_corruption"),
    # Starting over would delete what the run reads.
    ("overwrite_deletes_an_input", FINE_TUNE, ["--tokenizer_name", "{out}/best"],
     "out/best, which --overwrite_output_dir deletes before this run starts", "copy it out of --output_dir"),
    ("ul2_without_mode_tokens", PRE_TRAIN, ["--objective", "ul2", "--tokenizer_name", "{f}/no_modes"],
     "has no mode tokens ['[NLG]', '[NLU]', '[S2S]']", "train one with `python -m t5_training.tokenizer`"),
    # At 512, UL2's X(mu=3, r=0.5) corrupts 127 spans; the tokenizer command gives 100 sentinels.
    ("ul2_too_few_sentinels", PRE_TRAIN, ["--objective", "ul2", "--max_seq_length", "512"],
     "--max_seq_length 512: denoiser 'X_3_0.5' puts 127 noise spans", "--max_seq_length 404 fits"),
    # Span corruption at density 0.5: 766-token chunks get 128 spans, over the 100 sentinels.
    ("span_corruption_too_few_sentinels", PRE_TRAIN, ["--noise_density", "0.5", "--max_seq_length", "512"],
     "--max_seq_length 512: chunks of 766 tokens get 128 noise spans, but only 100 sentinels",
     "--max_seq_length 403 fits"),
]


class BadInputTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.files = tempfile.mkdtemp()
        f = cls.files
        _write(f"{f}/no_label.csv", "sentence,score\ngood film,1\n")
        _write(f"{f}/bad_label.csv", "sentence,label\ngood film,positive\nbad film,great\n")
        _write(f"{f}/empty_label.csv", "sentence,label\ngood film,1\nbad film,\n")
        _write(f"{f}/header_only.csv", "sentence,label\n")
        _write(f"{f}/nan_score.csv", "sentence1,sentence2,label\na cat,a dog,2.5\na man,a car,nan\n")
        # A --data_dir whose training file has a Latin-1 byte on line 3.
        dev = os.path.join(fixtures.sst2_dir(), "dev.tsv")
        shutil.copy(dev, _write(f"{f}/latin1/dev.tsv", ""))
        _write(f"{f}/latin1/train.tsv", b"sentence\tlabel\ngood film\t1\ncaf\xe9 scene\t0\n")
        # A --data_dir with SST-2's labelled files but not its test file.
        for name in ("train.tsv", "dev.tsv"):
            shutil.copy(dev, _write(f"{f}/no_test/{name}", ""))
        _write(f"{f}/bart.json", json.dumps({
            "model_type": "bart", "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
            "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32, "max_position_embeddings": 32, "vocab_size": 1000}))
        T5TokenizerFast(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁a", -1.0)],
                        extra_ids=0).save_pretrained(f"{f}/no_sentinels")
        _write(f"{f}/corpus.txt", "a small corpus line\n" * 50)
        T5TokenizerFast(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁a", -1.0)],
                        extra_ids=100).save_pretrained(f"{f}/no_modes")
        short = "{name: short, kind: span, mean_noise_span_length: 3, noise_density: 0.15, mode_token: '[NLU]'"
        _write(f"{f}/unknown_key.yaml", f"- {short}, rate: 1, span: 3}}\n")
        _write(f"{f}/rate_zero.yaml", f"- {short}, rate: 1}}\n- {{name: lm, kind: prefix, noise_density: 0.5, "
                                      "mode_token: '[S2S]', rate: 0}\n")
        _write(f"{f}/lost_base/adapter/adapter_config.json", json.dumps({
            "peft_type": "PROMPT_TUNING", "task_type": "SEQ_2_SEQ_LM", "num_virtual_tokens": 5,
            "num_transformer_submodules": 1, "base_model_name_or_path": f"{f}/nowhere"}))
        _write(f"{f}/not_yaml.yaml", "- {name: short, kind: [span\n")

        # Every case at once (tests/cli_batch.py): one Python start instead of one per case.
        cls.roots, cls.before, commands = {}, {}, []
        for name, script, flags, problem, _ in CASES:
            out = os.path.join(tempfile.mkdtemp(), "out")
            cls.roots[name] = out
            _earlier_run(out)
            # A checkpoint killed before its manifest, and one whose manifest checks out but whose
            # files are not what accelerate wrote.
            _write(os.path.join(out, "step-000004", "model.safetensors"), b"half")
            cls.before[name] = fixtures.snapshot(out)
            flags = [flag.format(f=f, out=out, glue=fixtures.glue_dir()) for flag in flags]
            # Even with --overwrite_output_dir a refused run must delete or write nothing.
            overwrite = "is not empty" not in problem and "--resume_from_checkpoint" not in flags
            commands.append((script, cls._command(script, flags, out) + ["--overwrite_output_dir"] * overwrite))
        cls.results = dict(zip([case[0] for case in CASES], cli_batch.run(commands)))

    @classmethod
    def tearDownClass(cls):
        for out in cls.roots.values():
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
        shutil.rmtree(cls.files, ignore_errors=True)
        super().tearDownClass()

    @classmethod
    def _command(cls, script: str, flags: list[str], out: str) -> list[str]:
        if script == PRE_TRAIN:
            # A flag given again in `flags` wins (argparse keeps the last).
            args = ["--config_name", fixtures.TINY_CONFIG, "--tokenizer_name", fixtures.tokenizer_dir(),
                    "--train_file", f"{cls.files}/corpus.txt", "--output_dir", out, "--max_steps", "2",
                    "--max_seq_length", "32", *flags]
        else:
            args = fixtures.fine_tune_args(out, "--max_steps", "2", *flags)
        return args

    @parameterized.named_parameters(*CASES)
    def test_one_line_exit_2_nothing_changed(self, script, flags, problem, fix):
        name = self._testMethodName.removeprefix("test_one_line_exit_2_nothing_changed_")
        done = self.results[name]
        self.assertEqual(done["returncode"], 2, done["stderr"][-2000:])
        lines = done["stderr"].strip().splitlines()
        self.assertLen(lines, 1, done["stderr"])
        self.assertStartsWith(lines[0], "error: ")
        self.assertIn(problem.format(f=self.files), lines[0])
        self.assertIn(fix, lines[0])
        self.assertEqual(fixtures.snapshot(self.roots[name]), self.before[name])


if __name__ == "__main__":
    absltest.main()
