"""Pretrain a T5 model with span corruption (or prefix LM, or UL2's mixture of denoisers) on a text corpus.

    accelerate launch pre_train_t5.py --config_name configs/t5-small.json --tokenizer_name runs/tok \
        --train_file 'corpus/*.txt' --output_dir runs/pt --max_steps 100000
    accelerate launch pre_train_t5.py --objective ul2 --max_seq_length 384 ...   # or --denoisers mixture.yaml
    accelerate launch pre_train_t5.py --dataset_name allenai/c4 --dataset_config_name en --streaming ...
    accelerate launch fine_tune_t5.py --model_name_or_path runs/pt/final --dataset_name sst2 ...

Defaults follow T5: Adafactor at 1e-2, inverse-sqrt decay after 10k steps, no dropout (T5 1.1),
512-token inputs with 15% noise in spans of mean length 3. Writes the same files as
fine_tune_t5.py; `final/` is a `save_pretrained` model that fine_tune_t5.py loads directly.
"""
from __future__ import annotations

import sys

from accelerate.utils import set_seed

from t5_training import agreement, batch_size, loop, pretrain_data, run_dir, runtime, teacher_forced, teardown
from t5_training.config import parse_config
from t5_training.errors import run_cli
from t5_training.modeling import check_lengths, load_tokenizer_and_model
from t5_training.pretrain_config import PreTrainConfig


def main(argv: list[str] | None = None) -> dict:
    """Parses, builds, prepares, resumes, trains and exports; returns the final results."""
    config = parse_config(PreTrainConfig, argv)
    resume_path = run_dir.check_output_dir(config)
    accelerator = runtime.build_accelerator(config, shapes=1 if pretrain_data.fixed_batch_shapes(config) else None)
    set_seed(config.seed)
    tokenizer, model = load_tokenizer_and_model(config)
    collator = pretrain_data.build_collator(config, tokenizer)
    check_lengths(model, max_seq_length=config.max_seq_length)

    train_data, eval_data = agreement.main_process_first(
        accelerator, lambda: pretrain_data.build_corpus(config, tokenizer, collator.raw_length, accelerator))
    longest = pretrain_data.make_longest_batch(collator, tokenizer)
    config = batch_size.find_batch_size(accelerator, config, model, longest)
    train_loader, eval_loader = pretrain_data.build_loaders(config, train_data, eval_data, collator)

    # A stream is not sharded by accelerate: each process already reads its own share of it.
    run = runtime.prepare(accelerator, config, model, train_loader, {"validation": eval_loader},
                          shard_train_loader=not config.streaming)
    drawn = pretrain_data.drawn_from(config, collator)
    state = run_dir.resume(accelerator, config, resume_path, loop.TrainState(), run.scheduler,
                           streaming=config.streaming,
                           check=lambda saved, path: pretrain_data.check_same_objective(saved.mixture, drawn, path))
    state.mixture = drawn
    runtime.init_trackers(accelerator, config, config.project_name)
    objective = loop.Objective("loss", greater_is_better=False)
    # A mixture's held-out loss is also reported per denoiser, as eval/<name>/loss.
    names = [d.name for d in collator.denoisers] if config.resolved_objective == "ul2" else []
    evaluate = teacher_forced.make_evaluator(accelerator, run.eval_loaders["validation"], names)
    state = loop.train(accelerator, config, run, state, objective=objective, evaluate=evaluate,
                       export=run_dir.exporter(accelerator, tokenizer, config.output_dir))
    run_dir.export_final(accelerator, run.model, tokenizer, config.output_dir)
    results = run_dir.write_results(accelerator, config, state, objective, run.batches_per_epoch)
    runtime.close(accelerator)
    return results


if __name__ == "__main__":
    teardown.exit_process(run_cli(main, sys.argv[1:]))
