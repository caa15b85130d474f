"""Fine-tuning's runs without training: evaluating a trained model (--do_train false) and predicting the
unlabelled test splits into a leaderboard's files (--do_predict)."""
from __future__ import annotations

from t5_training import data, evaluation, multitask, run_dir, runtime, submission


def evaluate_only(accelerator, config, tasks, model, tokenizer, start_id, decodings):
    """--do_train false: the model's metrics on the eval splits, logged and written to eval_results.json."""
    model, eval_loaders = runtime.prepare_inference(
        accelerator, model, data.ordered_loaders(multitask.eval_splits(tasks), config, tokenizer, start_id))
    run_dir.start_output_dir(accelerator, config, resuming=False)
    runtime.init_trackers(accelerator, config, config.project_name)
    model.eval()
    results = multitask.make_evaluator(accelerator, config, tasks, eval_loaders, tokenizer, decodings)(model)
    accelerator.log({f"eval/{key}": value for key, value in results.items()}, step=0)
    return model, {"eval": run_dir.write_eval_results(accelerator, config.output_dir, results)}


def predict(accelerator, config, tasks, model, tokenizer, start_id, decodings) -> dict:
    """--do_predict: every task's test rows decoded as its eval rows are, written as the leaderboard's files;
    what was written, and what fell back or is missing, also goes to predict_results.json."""
    parts, written, warn = [], {}, runtime.warn(accelerator)
    for name, entry in tasks.entries.items():
        tests, task = tasks.tests[name], tasks.data[name]
        loaders = runtime.prepare_loaders(accelerator, data.ordered_loaders(tests, config, tokenizer, start_id))
        predictions = evaluation.make_test_predictor(
            accelerator, entry, tests, loaders, tokenizer, config.output_dir, decodings[name],
            config.max_target_length, task.max_target_tokens, file_prefix=f"{name}_" if tasks.mixed else "")(model)
        if accelerator.is_main_process:
            parts.append(submission.write_task_files(entry, tests, predictions, task.train_labels,
                                                     config.output_dir, accelerator.print, warn))
    if accelerator.is_main_process:
        written = submission.finish(config.output_dir, parts, accelerator.print, warn)
    accelerator.wait_for_everyone()
    return written
