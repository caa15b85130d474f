"""Fine-tune and evaluate a T5 model on a text-to-text task from DATASET_VALS.

    accelerate launch fine_tune_t5.py --benchmark glue --dataset_name sst2 \
        --model_name_or_path t5-small --output_dir runs/sst2 --report_to wandb
    # offline, from the original GLUE files:
    python fine_tune_t5.py --benchmark glue --dataset_name sst2 --data_dir ../shared/data/SST-2 ...
    # a mixture of tasks (T5 section 3.5.2), each from its folder in --data_dir (glue_data/CoLA, ...):
    accelerate launch fine_tune_t5.py --benchmark glue --dataset_name all --data_dir glue_data \
        --mixing examples_proportional --mixing_cap 65536 ...
    # a model pretrained with UL2's mixture (pre_train_t5.py --objective ul2), fine-tuned in its NLU mode:
    accelerate launch fine_tune_t5.py --model_name_or_path runs/ul2/final --mode_token '[NLU]' ...
    # flags from a file, overridden on the command line:
    python fine_tune_t5.py --config run.yaml --learning_rate 1e-4
    # GLUE's leaderboard files from a trained model, no training:
    python fine_tune_t5.py --benchmark glue --dataset_name sst2 --model_name_or_path runs/sst2/best \
        --do_train false --do_predict --data_dir ../shared/data/SST-2 --output_dir runs/sst2-test
    # the same from a --peft run's export: its adapter is put on its base (t5_training/adapter_export.py)
    python fine_tune_t5.py ... --model_name_or_path runs/sst2-prompt/best --do_train false --do_predict ...

Writes to --output_dir: step-NNNNNN/ checkpoints, best/ and final/ models (save_pretrained),
eval_results.json, train_results.json, predictions_<split>.tsv and loss_curve.png (an adapter's
exports: t5_training/adapters.py); with --do_predict, submission/<Task>.tsv, submission.zip and
predict_results.json: each file's rows, the outputs that named no label (written as a fallback)
and the leaderboard files that could not be written (t5_training/submission.py). A mixture
writes predictions_<task>_<split>.tsv, and mixture_rows.tsv and mixture_rates.json: every row it
trained on, and each task's configured and realised rate (t5_training/mixture.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from accelerate.utils import set_seed

from t5_training import (adapter_record, adapters, agreement, batch_size, data, evaluation, inference, loop,
                         mixture, multitask, no_label, run_dir, runtime)
from t5_training.config import ModelConfig, TrainingConfig, parse_config
from t5_training.errors import UsageError, run_cli
from t5_training.modeling import check_lengths, load_tokenizer_and_model
from t5_training.registry import DATASET_VALS


@dataclass(frozen=True)
class FineTuneConfig(ModelConfig, adapters.AdapterConfig, mixture.MixtureConfig, TrainingConfig):
    """Flags of fine_tune_t5.py: the shared training and model flags, the adapter (--peft), the mixture, the data."""

    benchmark: str = field(default="glue", metadata={"help": "A key of DATASET_VALS: glue, seq2seq, embedded."})
    dataset_name: str = field(default="sst2", metadata={"help": "A task of the benchmark, e.g. sst2, mnli; or a "
                                                                "mixture: all, or a comma list (cola,sst2,mrpc)."})
    data_dir: str | None = field(default=None, metadata={"help": "Folder with the task's original files; for a "
                                                                 "mixture, the folder holding each task's folder."})
    train_file: str | None = field(default=None, metadata={"help": "CSV/TSV/JSONL training rows."})
    validation_file: str | None = field(default=None, metadata={"help": "CSV/TSV/JSONL evaluation rows."})
    max_source_length: int = 512
    mode_token: str | None = field(
        default=None, metadata={"help": "A token put before every source (training, evaluation, prediction), e.g. "
                                        "[NLU]: UL2 fine-tunes a model pretrained with --objective ul2 in a mode."})
    max_target_length: int = 64
    max_train_samples: int | None = field(default=None, metadata={"help": "Use the first N rows; 0 means all."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use the first N rows; 0 means all."})
    group_by_length: bool = field(default=False, metadata={"help": "Batch rows of similar length together, "
                                                                     "so dynamic padding pads little."})
    eval_decoding: Literal["auto", "generate", "score"] = field(
        default="auto", metadata={"help": "'score': one forward pass over the label candidates, with greedy "
                                          "decoding's exact predictions (classification); 'auto': score "
                                          "where it applies, else generate."}
    )
    rouge_use_stemmer: bool = field(
        default=False, metadata={"help": "Porter-stem words before ROUGE. T5 reports ROUGE unstemmed (the default); "
                                         "stemmed scores are higher and not comparable with T5's."})
    project_name: str = field(default="t5-fine-tune", metadata={"help": "Tracker (W&B) project."})
    do_train: bool = field(
        default=True, metadata={"help": "Train. false: only evaluate --model_name_or_path on the eval splits "
                                        "(and predict, with --do_predict): no optimizer, no checkpoints. An "
                                        "adapter run's best/ or final/ (prompt tuning's too) or its adapter/ "
                                        "loads with its base, through peft; no --peft."})
    do_predict: bool = field(
        default=False, metadata={"help": "Predict the unlabelled test splits with the final model and write the "
                                         "leaderboard's files: submission/<Task>.tsv and submission.zip, and "
                                         "predict_results.json (per file: outputs that named no label and were "
                                         "written as a fallback, warned about on stderr; files not written)."})

    def __post_init__(self):
        # The order picks the error several bad flags get: adapter, training, this script's, the mixture's (registry).
        self.check_adapter_flags()
        self.check_training_flags()
        if self.max_source_length < 2 or self.max_target_length < 2:
            raise UsageError("--max_source_length and --max_target_length must be at least 2 (text + EOS)")
        for name in ("max_train_samples", "max_eval_samples"):
            if (getattr(self, name) or 0) < 0:
                raise UsageError(f"--{name} must be >= 0 (0 or unset means every row), got {getattr(self, name)}")
        if bool(self.train_file) != bool(self.validation_file):
            raise UsageError("pass both --train_file and --validation_file, or neither")
        if not self.do_train:
            self._check_evaluation_only()
        if self.benchmark in DATASET_VALS:  # an unknown one is named when the run starts
            self.check_mixture_flags(mixture.task_names(DATASET_VALS[self.benchmark], self.dataset_name))

    def check_given(self, given: frozenset[str]) -> None:
        """Refuses adapter flags under --do_train false, which reads an adapter with its settings, then the rest."""
        typed = [f"--{name}" for names in adapters.METHOD_FLAGS.values() for name in names if name in given]
        if typed and not self.do_train:
            raise UsageError(f"{' and '.join(typed)} set{'s' if len(typed) == 1 else ''} up an adapter to train, and "
                             "--do_train false trains nothing (an adapter is read from --model_name_or_path's export, "
                             f"with its own settings): drop {'it' if len(typed) == 1 else 'them'}")
        super().check_given(given)

    def _check_evaluation_only(self):
        if not self.model_name_or_path:
            raise UsageError("--do_train false evaluates a trained model: pass it as --model_name_or_path "
                             "(e.g. runs/sst2/best)")
        if self.resume_from_checkpoint:
            raise UsageError("--resume_from_checkpoint continues training; with --do_train false pass the model "
                             "as --model_name_or_path instead")
        if self.peft != "none":
            raise UsageError(f"--peft {self.peft} trains a new adapter; with --do_train false pass the trained "
                             "model's export (its best/ or final/, which hold the adapter and name its base) as "
                             "--model_name_or_path, without --peft")
        mixing = self.mixture_flags_set()
        if mixing:
            one = len(mixing) == 1
            raise UsageError(f"{' and '.join(mixing)} {'sets' if one else 'set'} how training draws rows from a "
                             "mixture's tasks, and --do_train false trains nothing (it evaluates every task on all its "
                             f"rows): drop {'it' if one else 'them'}")


def main(argv: list[str] | None = None) -> dict:
    """Parses and builds; trains and exports (or only evaluates: --do_train false); predicts (--do_predict)."""
    config = parse_config(FineTuneConfig, argv)
    entries = multitask.entries(config)
    resume_path = run_dir.check_output_dir(config)
    accelerator = runtime.build_accelerator(config)
    warn = runtime.warn(accelerator)
    set_seed(config.seed)
    tokenizer, model = load_tokenizer_and_model(config, evaluate_only=not config.do_train)
    check_lengths(model, max_source_length=config.max_source_length, max_target_length=config.max_target_length)
    model = adapters.apply(model, config, config.tokenizer_name or config.model_name_or_path,
                           zero3=runtime.uses_deepspeed_zero3(accelerator), random_base=not config.model_name_or_path,
                           log=accelerator.print)
    # Before accelerate prepares the model (ZeRO-3 partitions it), and before any data is read.
    adapter = adapter_record.describe(config, model)
    adapter_record.check_resume(resume_path, adapter)

    # Every input, test files included, is read and checked before anything is written.
    tasks = agreement.main_process_first(
        accelerator, lambda: multitask.read_tasks(config, entries, tokenizer, accelerator.print, warn))
    decodings = multitask.resolve_decodings(config.eval_decoding, tasks, accelerator)
    start_id = model.config.decoder_start_token_id
    if config.do_train:
        model, results = train(accelerator, config, tasks, model, tokenizer, start_id, decodings, resume_path, adapter)
    else:
        model, results = inference.evaluate_only(accelerator, config, tasks, model, tokenizer, start_id, decodings)
    for line in no_label.dev_warnings(results["eval"]):
        warn(line)
    if config.do_predict:
        results["predict"] = inference.predict(accelerator, config, tasks, model, tokenizer, start_id, decodings)
    runtime.close(accelerator)
    return results


def train(accelerator, config, tasks, model, tokenizer, start_id, decodings, resume_path, adapter):
    """Prepares, resumes, trains and exports; returns the trained model and the results files' contents."""
    longest = data.make_longest_batch(multitask.combined_train(tasks), tokenizer, start_id)
    config = batch_size.find_batch_size(accelerator, config, model, longest)
    train_loader, eval_loaders = multitask.build_loaders(tasks, config, tokenizer, start_id,
                                                         accelerator.num_processes)
    sampler = train_loader.sampler  # before prepare wraps the loader: a mixture's rows are read back from it
    drawn = mixture.task_record(list(tasks.entries), sampler) if tasks.mixed else {}

    run = runtime.prepare(accelerator, config, model, train_loader, eval_loaders)
    state = run_dir.resume(accelerator, config, resume_path, loop.TrainState(), run.scheduler,
                           check=lambda saved, path: mixture.check_same_tasks(saved.mixture, drawn, path))
    state.mixture, state.adapter = drawn, adapter
    runtime.init_trackers(accelerator, config, config.project_name)
    objective = multitask.objective(config.benchmark, tasks)
    evaluate_fn = multitask.make_evaluator(accelerator, config, tasks, run.eval_loaders, tokenizer, decodings)
    state = loop.train(accelerator, config, run, state, evaluate=evaluate_fn, objective=objective,
                       export=run_dir.exporter(accelerator, tokenizer, config.output_dir))
    run_dir.export_final(accelerator, run.model, tokenizer, config.output_dir)
    if tasks.mixed and accelerator.is_main_process:
        mixture.write_trained_rows(config.output_dir, list(tasks.entries), sampler, state.epoch,
                                   state.samples_in_epoch, accelerator.print)
    return run.model, run_dir.write_results(accelerator, config, state, objective, run.batches_per_epoch)


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
