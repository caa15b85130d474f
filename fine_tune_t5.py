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

from accelerate.utils import set_seed

from t5_training import (adapter_record, adapters, agreement, batch_size, batching, data, inference, loop, mixture,
                         multitask, no_label, one_label, run_dir, runtime, teardown)
from t5_training.config import parse_config
from t5_training.errors import run_cli
from t5_training.fine_tune_config import FineTuneConfig
from t5_training.modeling import check_lengths, load_tokenizer_and_model


def main(argv: list[str] | None = None) -> dict:
    """Parses and builds; trains and exports (or only evaluates: --do_train false); predicts (--do_predict)."""
    config = parse_config(FineTuneConfig, argv)
    entries = multitask.entries(config)
    resume_path = run_dir.check_output_dir(config)
    accelerator = runtime.build_accelerator(config, shapes=batching.compiled_shape_count(config))
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
    for line in no_label.dev_warnings(results["eval"]) + one_label.dev_warnings(results["eval"]):
        warn(line)
    if config.do_predict:
        results["predict"] = inference.predict(accelerator, config, tasks, model, tokenizer, start_id, decodings)
    runtime.close(accelerator)
    return results


def train(accelerator, config, tasks, model, tokenizer, start_id, decodings, resume_path, adapter):
    """Prepares, resumes, trains and exports; returns the trained model and the results files' contents."""
    rows = multitask.combined_train(tasks)
    longest = data.make_longest_batch(rows, config, tokenizer, start_id)
    config = batch_size.find_batch_size(accelerator, config, model, longest)
    train_loader, eval_loaders = multitask.build_loaders(tasks, config, tokenizer, start_id,
                                                         accelerator.num_processes)
    sampler = train_loader.sampler  # before prepare wraps the loader: a mixture's rows are read back from it
    drawn = (mixture.task_record(list(tasks.entries), sampler) if tasks.mixed
             else mixture.one_task_record(next(iter(tasks.entries)), len(rows)))

    run = runtime.prepare(accelerator, config, model, train_loader, eval_loaders)
    state = run_dir.resume(accelerator, config, resume_path, loop.TrainState(), run.scheduler,
                           check=lambda saved, path: mixture.check_same_tasks(saved.mixture, drawn, path))
    state.mixture, state.adapter = drawn, adapter
    runtime.init_trackers(accelerator, config, config.project_name)
    objective = multitask.objective(config.benchmark, tasks)
    evaluate_fn = one_label.watch(multitask.make_evaluator(accelerator, config, tasks, run.eval_loaders, tokenizer,
                                                           decodings), runtime.warn(accelerator))
    state = loop.train(accelerator, config, run, state, evaluate=evaluate_fn, objective=objective,
                       export=run_dir.exporter(accelerator, tokenizer, config.output_dir))
    run_dir.export_final(accelerator, run.model, tokenizer, config.output_dir)
    if tasks.mixed and accelerator.is_main_process:
        mixture.write_trained_rows(config.output_dir, list(tasks.entries), sampler, state.epoch,
                                   state.samples_in_epoch, accelerator.print)
    return run.model, run_dir.write_results(accelerator, config, state, objective, run.batches_per_epoch)


if __name__ == "__main__":
    teardown.exit_process(run_cli(main, sys.argv[1:]))
