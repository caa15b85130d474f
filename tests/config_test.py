"""Tests for t5_training.config.parse_config with fine_tune_t5.FineTuneConfig."""

import contextlib
import dataclasses
import io
import os
import runpy
import sys
import tempfile

from absl.testing import absltest, parameterized
from absl.testing.absltest import mock

import fine_tune_t5  # importing the script must not start a run
import pre_train_t5
from transformers import HfArgumentParser

from t5_training import adapters, runtime
from t5_training.config import TrainingConfig, config_to_dict, given_flags, parse_config
from t5_training.errors import UsageError

FineTuneConfig = fine_tune_t5.FineTuneConfig


def parse(*words):
    return parse_config(FineTuneConfig, list(words))


class ParseConfigTest(parameterized.TestCase):

    def test_defaults(self):
        config = parse()
        self.assertEqual(config, FineTuneConfig())
        self.assertIsInstance(config, TrainingConfig)
        self.assertEqual((config.resolved_learning_rate, config.seed, config.benchmark, config.dataset_name),
                         (3e-4, 42, "glue", "sst2"))
        self.assertIsNone(config.learning_rate)  # the flag as given: unset
        self.assertIs(config.overwrite_output_dir, False)
        self.assertIsNone(config.data_dir)
        self.assertEqual(parse_config(FineTuneConfig, None), config)

    def test_import_starts_nothing(self):
        # Run the module's top level again as an import would, with words in sys.argv that
        # main() would reject: nothing may parse them, print, or write into the working dir.
        with tempfile.TemporaryDirectory() as cwd, \
                mock.patch.object(sys, "argv", ["fine_tune_t5.py", "--learning_rte", "1"]), \
                contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            old_cwd = os.getcwd()
            os.chdir(cwd)
            try:
                module = runpy.run_path(fine_tune_t5.__file__, run_name="fine_tune_t5")
            finally:
                os.chdir(old_cwd)
            self.assertEqual(os.listdir(cwd), [])
        self.assertEqual((out.getvalue(), err.getvalue()), ("", ""))
        self.assertEqual([f.name for f in dataclasses.fields(module["FineTuneConfig"])],
                         [f.name for f in dataclasses.fields(FineTuneConfig)])

    @parameterized.named_parameters(
        ("space", ["--learning_rate", "1e-4", "--seed", "7"]),
        ("equals", ["--learning_rate=1e-4", "--seed=7"]),  # what a W&B agent passes
        ("mixed", ["--learning_rate=1e-4", "--seed", "7"]),
        ("dashes", ["--learning-rate", "1e-4", "--seed=7"]),
    )
    def test_flag_forms(self, words):
        config = parse(*words)
        self.assertEqual((config.learning_rate, config.seed), (1e-4, 7))

    def test_wandb_agent_style(self):
        config = parse("--learning_rate=3e-4", "--per_device_train_batch_size=16", "--lr_scheduler_type=cosine",
                       "--dataset_name=mnli", "--max_eval_samples=100", "--dropout_rate=0.0")
        self.assertEqual(config.learning_rate, 3e-4)
        self.assertEqual(config.per_device_train_batch_size, 16)
        self.assertEqual(config.lr_scheduler_type, "cosine")
        self.assertEqual(config.dataset_name, "mnli")
        self.assertEqual(config.max_eval_samples, 100)
        self.assertEqual(config.dropout_rate, 0.0)

    @parameterized.named_parameters(
        ("bare", ["--overwrite_output_dir"], True),
        ("true", ["--overwrite_output_dir", "true"], True),
        ("equals_true", ["--overwrite_output_dir=True"], True),
        ("false", ["--overwrite_output_dir", "false"], False),
        ("zero", ["--overwrite_output_dir", "0"], False),
        ("bare_then_flag", ["--overwrite_output_dir", "--seed", "3"], True),
    )
    def test_bool_flags(self, words, expected):
        self.assertIs(parse(*words).overwrite_output_dir, expected)

    def test_train_and_predict_flags(self):
        self.assertEqual((parse().do_train, parse().do_predict), (True, False))
        config = parse("--do_train", "false", "--do_predict", "--model_name_or_path", "runs/sst2/best")
        self.assertEqual((config.do_train, config.do_predict), (False, True))

    def test_gradient_checkpointing_true(self):
        config = parse("--gradient_checkpointing", "true", "--trust_remote_code")
        self.assertIs(config.gradient_checkpointing, True)
        self.assertIs(config.trust_remote_code, True)
        self.assertIs(config.overwrite_output_dir, False)

    def test_later_flag_wins(self):
        self.assertEqual(parse("--seed", "1", "--seed", "2").seed, 2)

    @parameterized.named_parameters(
        ("typo", "--learning_rte", "--learning_rate"),
        ("typo_equals", "--learning_rte=1e-4", "--learning_rate"),
        ("abbreviation", "--learning", "--learning_rate"),  # rejected, not expanded
        ("abbreviation_batch", "--per_device_train", "--per_device_train_batch_size"),
        ("swapped_letters", "--sede", "--seed"),
        ("hub_style_name", "--model_name", "--model_name_or_path"),
    )
    def test_misspelt_flag_suggests(self, flag, suggestion):
        with self.assertRaisesRegex(UsageError, rf"^unknown flag {flag.split('=')[0]}; did you mean {suggestion}\?$"):
            parse(flag, "1e-4")

    def test_unknown_flag_without_match(self):
        with self.assertRaisesRegex(UsageError, r"^unknown flag --zzzqqq; run with --help to list the flags$"):
            parse("--seed", "3", "--zzzqqq", "1")

    def test_stray_word(self):
        with self.assertRaisesRegex(UsageError, r"unexpected argument 'sst2'"):
            parse("--seed", "3", "sst2")

    @parameterized.named_parameters(
        ("zero_batch", ["--per_device_train_batch_size", "0"], r"--per_device_train_batch_size must be at least 1"),
        ("zero_eval_batch", ["--per_device_eval_batch_size=0"], r"--per_device_eval_batch_size must be at least 1"),
        ("bogus_scheduler", ["--lr_scheduler_type", "bogus"], r"invalid choice: 'bogus'.*'linear', 'cosine'"),
        ("bogus_optim", ["--optim", "sgd"], r"invalid choice: 'sgd'"),
        ("warmup_ratio_above", ["--warmup_ratio", "1.5"], r"--warmup_ratio must be in \[0, 1\), got 1.5"),
        ("warmup_ratio_one", ["--warmup_ratio", "1"], r"--warmup_ratio must be in \[0, 1\), got 1.0"),
        ("negative_lr", ["--learning_rate=-1e-4"], r"--learning_rate must be positive"),
        ("not_an_int", ["--seed", "abc"], r"--seed: invalid int value: 'abc'"),
        ("not_a_bool", ["--gradient_checkpointing", "maybe"], r"Truthy value expected"),
        ("negative_eval_steps", ["--eval_steps", "-5"], r"--eval_steps must be >= 0, got -5"),
        ("negative_steps", ["--max_steps", "-3"], r"^--max_steps must be positive \(or -1: train --num_train_epochs\), "
                                                  r"got -3$"),
        ("beta1_above_one", ["--adam_beta1", "1.5"], r"^--adam_beta1 must be in \[0, 1\), got 1.5$"),
        ("beta2_negative", ["--adam_beta2", "-0.1"], r"^--adam_beta2 must be in \[0, 1\), got -0.1$"),
        ("negative_epsilon", ["--adam_epsilon", "-1"], r"^--adam_epsilon must be >= 0, got -1.0$"),
        ("negative_weight_decay", ["--weight_decay", "-1"], r"^--weight_decay must be >= 0, got -1.0$"),
        ("negative_clipping", ["--max_grad_norm", "-1"], r"^--max_grad_norm must be >= 0, got -1.0$"),
        ("negative_seed", ["--seed", "-1"], r"^--seed must be in \[0, 2\*\*32\), got -1$"),
        ("seed_too_large", ["--seed", str(2**32)], r"^--seed must be in \[0, 2\*\*32\), got 4294967296$"),
        ("nothing_to_train", ["--max_steps", "0", "--num_train_epochs", "0"],
         r"^nothing to train: set --max_steps or --num_train_epochs to a positive number$"),
        ("short_source", ["--max_source_length", "1"], r"--max_source_length and --max_target_length"),
        ("one_file_only", ["--train_file", "a.csv"], r"pass both --train_file and --validation_file"),
        ("evaluate_nothing", ["--do_train", "false"],
         r"^--do_train false evaluates a trained model: pass it as --model_name_or_path"),
        ("evaluate_and_resume", ["--do_train", "false", "--model_name_or_path", "m", "--resume_from_checkpoint",
                                 "auto"], r"^--resume_from_checkpoint continues training; with --do_train false"),
        ("evaluate_a_new_adapter", ["--do_train=false", "--model_name_or_path", "m", "--peft", "lora"],
         r"^--peft lora trains a new adapter; with --do_train false pass the trained model's export \(its best/ or "
         r"final/, which hold the adapter and name its base\) as --model_name_or_path, without --peft$"),
    )
    def test_invalid_values(self, words, message):
        with self.assertRaisesRegex(UsageError, message):
            parse(*words)

    @parameterized.named_parameters(
        # An unset rate and schedule are the optimizer's (OPTIMIZER_DEFAULTS); typed ones stay.
        ("adamw", [], 3e-4, "linear"),
        ("adafactor", ["--optim", "adafactor"], 1e-3, "constant"),
        ("typed", ["--optim", "adafactor", "--lr_scheduler_type", "cosine", "--learning_rate", "2e-3"], 2e-3,
         "cosine"),
    )
    def test_unset_rate_and_schedule_follow_the_optimizer(self, words, learning_rate, schedule):
        config = parse(*words)
        self.assertEqual((config.resolved_learning_rate, config.resolved_lr_scheduler_type), (learning_rate, schedule))
        # The fields keep what was typed (None: unset); the record holds the values the run uses.
        typed = "--learning_rate" in words
        self.assertEqual((config.learning_rate, config.lr_scheduler_type),
                         (learning_rate, schedule) if typed else (None, None))
        self.assertEqual((config_to_dict(config)["learning_rate"], config_to_dict(config)["lr_scheduler_type"]),
                         (learning_rate, schedule))

    @parameterized.named_parameters(
        ("one_step", ["--max_steps", "1", "--num_train_epochs", "0"], 1, 0.0),
        ("half_an_epoch", ["--num_train_epochs", "0.5"], -1, 0.5),
    )
    def test_the_least_training_is_accepted(self, words, max_steps, epochs):
        # "Nothing to train" is max_steps <= 0 with epochs <= 0: one step or half an epoch is something.
        config = parse(*words)
        self.assertEqual((config.max_steps, config.num_train_epochs), (max_steps, epochs))

    def test_the_bounds_of_the_optimizer_flags_and_the_seed_are_accepted(self):
        config = parse("--adam_beta1", "0", "--adam_beta2", "0.999999", "--adam_epsilon", "0", "--weight_decay", "0",
                       "--max_grad_norm", "0", "--seed", str(2**32 - 1), "--max_steps", "-1")
        self.assertEqual((config.adam_beta1, config.seed, config.max_steps), (0.0, 2**32 - 1, -1))
        self.assertEqual(parse("--seed", "0").seed, 0)

    def test_zero_learning_rate_is_refused(self):
        with self.assertRaisesRegex(UsageError, r"^--learning_rate must be positive, got 0.0$"):
            parse("--learning_rate", "0")

    def test_value_holding_equals_signs(self):
        # --flag=value splits at the first "=" only, for the unknown-flag check and the flags given alike.
        self.assertEqual(parse("--run_name=lr=1e-4", "--output_dir=a=b").run_name, "lr=1e-4")

    def test_given_flags_counts_config_fields_only(self):
        parser = HfArgumentParser(FineTuneConfig)
        given = given_flags(parser, ["-h", "--seed=3", "--lora-r", "4", "--run_name", "--not_a_flag", "x"])
        self.assertEqual(given, {"seed", "lora_r", "run_name"})

    def test_a_config_without_check_given(self):
        # check_given is optional: the shared TrainingConfig has none.
        config = parse_config(TrainingConfig, ["--seed", "3", "--max_steps=5"])
        self.assertEqual((type(config), config.seed, config.max_steps), (TrainingConfig, 3, 5))

    def test_no_args_file_beside_the_script_is_read(self):
        # HfArgumentParser can put the words of <script>.args before the command line; a run takes only its own.
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "fine_tune_t5.args"), "w", encoding="utf-8") as f:
                f.write("--seed 5 --run_name from-the-args-file\n")
            with mock.patch.object(sys, "argv", [os.path.join(folder, "fine_tune_t5.py")]):
                config = parse("--learning_rate", "1e-4")
        self.assertEqual((config.seed, config.run_name, config.learning_rate), (42, None, 1e-4))

    def test_frozen(self):
        config = parse("--seed", "3")
        with self.assertRaises(dataclasses.FrozenInstanceError):
            config.seed = 4
        with self.assertRaises(dataclasses.FrozenInstanceError):
            config.learning_rate = 1.0
        self.assertEqual(config.seed, 3)
        self.assertEqual(dataclasses.replace(config, seed=4).seed, 4)

    def test_config_to_dict(self):
        values = config_to_dict(parse("--seed", "5", "--dataset_name", "cola"))
        self.assertEqual((values["seed"], values["dataset_name"], values["learning_rate"]), (5, "cola", 3e-4))
        self.assertEqual(values["lr_scheduler_type"], "linear")
        self.assertEqual(set(values), {f.name for f in dataclasses.fields(FineTuneConfig)})

    def test_trackers_are_sent_the_values_the_run_uses(self):
        # W&B's and tensorboard's config (runtime.init_trackers): an unset rate is sent as the optimizer's.
        config = parse("--optim", "adafactor", "--report_to", "wandb")
        accelerator = mock.Mock()
        runtime.init_trackers(accelerator, config, "project")
        sent = accelerator.init_trackers.call_args.kwargs["config"]
        self.assertEqual((sent["learning_rate"], sent["lr_scheduler_type"]), (1e-3, "constant"))
        self.assertEqual((config.learning_rate, config.lr_scheduler_type), (None, None))

    def test_validation_runs_in_a_fixed_order(self):
        # The adapter flags first, then the training loop's, then fine_tune_t5.py's own.
        bad = {"adapter": ["--lora_r", "0"], "training": ["--per_device_train_batch_size", "0"],
               "script": ["--max_source_length", "1"]}
        lines = {"adapter": "--lora_r must be >= 1", "training": "--per_device_train_batch_size must be at least 1",
                 "script": "--max_source_length and --max_target_length must be at least 2"}
        for first, rest in (("adapter", ("training", "script")), ("training", ("script",)), ("script", ())):
            words = [word for name in (first, *rest) for word in bad[name]]
            with self.assertRaisesRegex(UsageError, "^" + lines[first]):
                parse(*words)

    def test_fine_tune_runs_the_checks_of_every_part(self):
        # FineTuneConfig calls its parts' checks by name, not through super(): a part that gains a
        # __post_init__ must be called there too.
        with_checks = {base for base in FineTuneConfig.__mro__[1:] if "__post_init__" in vars(base)}
        self.assertEqual(with_checks, {adapters.AdapterConfig, TrainingConfig})


WHOLE_MODEL = "and this run trains the whole model (--peft none)"
SPAN_FLAGS_FOR_PREFIX_LM = ("span corruption's; --objective prefix_lm corrupts no spans (it cuts each chunk into a "
                            "prefix and its continuation)")


class FlagsWithoutEffectTest(parameterized.TestCase):
    """A flag typed where the other flags give it nothing to do is refused in one line, never ignored."""

    @parameterized.named_parameters(
        ("lora_without_peft", ["--lora_r", "16", "--lora_alpha", "32"],
         f"--lora_r and --lora_alpha apply to --peft lora, {WHOLE_MODEL}: add --peft lora, or drop them"),
        ("lora_targets_without_peft", ["--lora_target_modules=q,k,v"],
         f"--lora_target_modules applies to --peft lora, {WHOLE_MODEL}: add --peft lora, or drop it"),
        # Typed as --flag=value whose value holds "=": still a flag given.
        ("lora_targets_with_equals_in_the_value", ["--lora_target_modules=q=v"],
         f"--lora_target_modules applies to --peft lora, {WHOLE_MODEL}: add --peft lora, or drop it"),
        ("lora_dropout_with_ia3", ["--peft", "ia3", "--lora_dropout", "0.1"],
         "--lora_dropout applies to --peft lora, and this run trains --peft ia3: drop it, or use --peft lora"),
        ("ia3_with_lora", ["--peft", "lora", "--ia3_target_modules", "k,v", "--ia3_feedforward_modules", "wo"],
         "--ia3_target_modules and --ia3_feedforward_modules apply to --peft ia3, and this run trains --peft lora: "
         "drop them, or use --peft ia3"),
        ("virtual_tokens_without_peft", ["--num_virtual_tokens", "10"],
         f"--num_virtual_tokens applies to --peft prompt_tuning, {WHOLE_MODEL}: add --peft prompt_tuning, or drop it"),
        # The default value, typed, counts: the user expected it to do something.
        ("virtual_tokens_default_with_lora", ["--peft", "lora", "--num_virtual_tokens", "20"],
         "--num_virtual_tokens applies to --peft prompt_tuning, and this run trains --peft lora: drop it, or use "
         "--peft prompt_tuning"),
        ("prompt_init_with_ia3", ["--peft", "ia3", "--prompt_init", "random"],
         "--prompt_init applies to --peft prompt_tuning, and this run trains --peft ia3: drop it, or use "
         "--peft prompt_tuning"),
        ("patience_without_evaluations", ["--early_stopping_patience", "3"],
         "--early_stopping_patience 3 counts evaluations without improvement, and --eval_steps 0 evaluates once, at "
         "the end: set --eval_steps N to evaluate every N steps, or drop --early_stopping_patience"),
        ("mixing_without_training", ["--do_train", "false", "--model_name_or_path", "m", "--dataset_name", "cola,sst2",
                                     "--mixing", "temperature", "--mixing_temperature", "2"],
         "--mixing and --mixing_temperature set how training draws rows from a mixture's tasks, and --do_train false "
         "trains nothing (it evaluates every task on all its rows): drop them"),
        ("mixing_cap_without_training", ["--do_train", "false", "--model_name_or_path", "m", "--dataset_name", "all",
                                         "--mixing_cap", "1000"],
         "--mixing_cap sets how training draws rows from a mixture's tasks, and --do_train false trains nothing "
         "(it evaluates every task on all its rows): drop it"),
        # An export's adapter is read with its settings (t5_training.adapter_export): there is none to set up.
        ("adapter_flags_without_training", ["--do_train", "false", "--model_name_or_path", "runs/pt/best",
                                            "--num_virtual_tokens", "5", "--prompt_init", "random"],
         "--num_virtual_tokens and --prompt_init set up an adapter to train, and --do_train false trains nothing (an "
         "adapter is read from --model_name_or_path's export, with its own settings): drop them"),
    )
    def test_fine_tune_refuses(self, words, line):
        with self.assertRaises(UsageError) as raised:
            parse(*words)
        self.assertEqual(str(raised.exception), line)

    @parameterized.named_parameters(
        ("fine_tuning_one", "fine_tune", ["--optim", "adafactor", "--adam_beta2", "0.98"],
         "--adam_beta2 sets AdamW's moments, and --optim adafactor has none of them: drop it, or use --optim "
         "adamw_torch or adamw_scale"),
        # Typed at its default: still a flag the run would ignore.
        ("pretraining_two_at_defaults", "pre_train", ["--adam_beta1", "0.9", "--adam_epsilon=1e-8"],
         "--adam_beta1 and --adam_epsilon set AdamW's moments, and --optim adafactor has none of them: drop them, "
         "or use --optim adamw_torch or adamw_scale"),
        ("hf_adafactor", "fine_tune", ["--optim", "adafactor_hf", "--adam_epsilon", "1e-6"],
         "--adam_epsilon sets AdamW's moments, and --optim adafactor_hf has none of them: drop it, or use --optim "
         "adamw_torch or adamw_scale"),
    )
    def test_adam_flags_without_adam_are_refused(self, script, words, line):
        cls, base = ((fine_tune_t5.FineTuneConfig, []) if script == "fine_tune" else
                     (pre_train_t5.PreTrainConfig, ["--train_file", "corpus.txt"]))
        with self.assertRaisesWithLiteralMatch(UsageError, line):
            parse_config(cls, [*base, *words])

    @parameterized.named_parameters(
        ("span_length", ["--mean_noise_span_length", "0.5"], "--mean_noise_span_length must be at least 1, got 0.5"),
        ("sequence", ["--max_seq_length", "4"], "--max_seq_length must be at least 8, got 4"),
        ("eval_samples", ["--max_eval_samples", "0"], "--max_eval_samples must be at least 1, got 0"),
    )
    def test_pretraining_bounds_name_the_value_that_is_wrong(self, words, line):
        with self.assertRaisesWithLiteralMatch(UsageError, line):
            parse_config(pre_train_t5.PreTrainConfig, ["--train_file", "x.txt", *words])

    def test_adam_flags_with_adam(self):
        for optim in ("adamw_torch", "adamw_scale"):
            config = parse_config(fine_tune_t5.FineTuneConfig, ["--optim", optim, "--adam_beta2", "0.98"])
            self.assertEqual(config.adam_beta2, 0.98)

    @parameterized.named_parameters(
        ("density_with_prefix_lm", ["--objective", "prefix_lm", "--noise_density", "0.3"],
         f"--noise_density is {SPAN_FLAGS_FOR_PREFIX_LM}: drop it, or use --objective span_corruption"),
        ("both_at_their_defaults_with_prefix_lm", ["--objective=prefix_lm", "--noise_density", "0.15",
                                                   "--mean_noise_span_length", "3"],
         f"--noise_density and --mean_noise_span_length are {SPAN_FLAGS_FOR_PREFIX_LM}: drop them, or use "
         "--objective span_corruption"),
        ("span_length_at_its_default_with_ul2", ["--objective", "ul2", "--mean_noise_span_length", "3"],
         "--mean_noise_span_length is span corruption's; with --objective ul2 each denoiser has its own: list them "
         "in a --denoisers file"),
    )
    def test_pre_train_refuses(self, words, line):
        with self.assertRaises(UsageError) as raised:
            parse_config(pre_train_t5.PreTrainConfig, ["--train_file", "x.txt", *words])
        self.assertEqual(str(raised.exception), line)

    @parameterized.named_parameters(
        ("lora", ["--peft", "lora", "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.1",
                  "--lora_target_modules", "q,v"]),
        ("ia3", ["--peft", "ia3", "--ia3_target_modules", "k,v,wo", "--ia3_feedforward_modules", "wo"]),
        ("prompt_tuning", ["--peft", "prompt_tuning", "--num_virtual_tokens", "5", "--prompt_init", "random"]),
        ("patience_with_evaluations", ["--eval_steps", "10", "--early_stopping_patience", "2"]),
        ("patience_zero", ["--early_stopping_patience", "0"]),  # 0 is "never stop early": nothing expected
        ("mixture_trained", ["--dataset_name", "cola,sst2", "--mixing", "temperature", "--mixing_temperature", "2"]),
        ("mixture_evaluated", ["--do_train", "false", "--model_name_or_path", "m", "--dataset_name", "cola,sst2"]),
    )
    def test_fine_tune_accepts_flags_that_apply(self, words):
        parse(*words)

    @parameterized.named_parameters(
        ("span_corruption", ["--noise_density", "0.3", "--mean_noise_span_length", "5"]),
        ("span_corruption_named", ["--objective", "span_corruption", "--noise_density", "0.3"]),
        ("prefix_lm", ["--objective", "prefix_lm"]),
    )
    def test_pre_train_accepts_flags_that_apply(self, words):
        parse_config(pre_train_t5.PreTrainConfig, ["--train_file", "x.txt", *words])

    def test_a_config_file_names_flags_as_the_command_line_does(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "run.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write("lora_r: 4\nlearning_rate: 1e-4\n")
            with self.assertRaisesRegex(UsageError, r"^--lora_r applies to --peft lora, and this run trains the"):
                parse("--config", path)
            self.assertEqual(parse("--config", path, "--peft", "lora").lora_r, 4)


if __name__ == "__main__":
    absltest.main()
