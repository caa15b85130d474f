"""Evaluation by generation: greedy decoding, gathered across processes, scored as T5 does.

Each process decodes its shard of the evaluation split; `gather_for_metrics` reassembles the
split without the duplicates that even sharding adds. Rows carry their index (`idx`), so the
split may be sorted by length for speed and still be reported in its original order.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate.utils import DistributedType

from t5_training.tasks import make_scorer, metric_key


@dataclass(frozen=True)
class SplitPredictions:
    predictions: list[str]
    loss: float


def teacher_forced_row_stats(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: summed target-token loss, number of target tokens, and tokens predicted right."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=batch["decoder_input_ids"]).logits
    labels = batch["labels"]
    loss = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none").sum(dim=1)
    valid = labels != -100
    correct = ((logits.argmax(dim=-1) == labels) & valid).sum(dim=1)
    return loss, valid.sum(dim=1), correct


def make_teacher_forced_evaluator(accelerator, loader):
    """`evaluate(model) -> {"loss", "accuracy"}`: mean target-token loss and the percentage of
    target tokens (sentinels included) predicted right, over a fixed evaluation set."""

    def evaluate(model) -> dict:
        totals = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad(), accelerator.autocast():
            for batch in loader:
                stats = accelerator.gather_for_metrics(teacher_forced_row_stats(model, batch))
                totals += torch.stack([s.sum().double().cpu() for s in stats])
        loss, tokens, correct = totals.tolist()
        return {"loss": loss / max(tokens, 1), "accuracy": 100 * correct / max(tokens, 1)}

    return evaluate


def decode_split(accelerator, model, loader, tokenizer, num_rows: int, max_new_tokens: int) -> SplitPredictions:
    """Greedy predictions for every row of a split (in row order) and the teacher-forced loss."""
    unwrapped = accelerator.unwrap_model(model)
    # Under ZeRO-3 every process must run the same number of forward passes while generating.
    zero3 = (accelerator.distributed_type == DistributedType.DEEPSPEED
             and accelerator.state.deepspeed_plugin.zero_stage == 3)
    predictions: list[str | None] = [None] * num_rows
    loss_sum, token_count = 0.0, 0
    with torch.no_grad(), accelerator.autocast():
        for batch in loader:
            row_loss, row_tokens, _ = teacher_forced_row_stats(model, batch)
            generated = unwrapped.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                max_new_tokens=max_new_tokens, num_beams=1, do_sample=False, synced_gpus=zero3,
            )
            generated = accelerator.pad_across_processes(generated, dim=1, pad_index=tokenizer.pad_token_id)
            idx, generated, row_loss, row_tokens = accelerator.gather_for_metrics(
                (batch["idx"], generated, row_loss, row_tokens)
            )
            loss_sum += float(row_loss.sum())
            token_count += int(row_tokens.sum())
            for i, text in zip(idx.tolist(), tokenizer.batch_decode(generated, skip_special_tokens=True)):
                predictions[i] = text.strip()
    missing = predictions.count(None)
    if missing:
        raise RuntimeError(f"{missing} evaluation rows were never decoded; the evaluation loader lost rows")
    return SplitPredictions(predictions=predictions, loss=loss_sum / max(token_count, 1))


def write_predictions(path: str, sources, predictions, targets) -> None:
    """A TSV of input, prediction and reference, one row per example, written atomically."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerow(["input", "prediction", "reference"])
        writer.writerows(zip(sources, predictions, targets))
    os.replace(tmp, path)


def make_generation_evaluator(accelerator, entry, task, eval_loaders: dict, tokenizer, output_dir: str):
    """`evaluate(model) -> {metric key: value}` for every eval split of a task.

    Keys follow `tasks.metric_key` ("accuracy", or "validation_matched/accuracy" when a task
    has several eval splits), plus the split's teacher-forced "loss". Each call also rewrites
    `output_dir/predictions_<split>.tsv`.
    """
    score = make_scorer(entry)
    # Reports list rows in their original order; the loaders see them sorted by length.
    texts = {}
    for split, ds in task.evals.items():
        order = ds["idx"]
        sources, targets = [None] * len(ds), [None] * len(ds)
        for i, source, target in zip(order, ds["source"], ds["target"]):
            sources[i], targets[i] = source, target
        texts[split] = (sources, targets)

    def evaluate(model) -> dict:
        results = {}
        for split, loader in eval_loaders.items():
            sources, targets = texts[split]
            out = decode_split(accelerator, model, loader, tokenizer, len(sources), task.max_target_tokens)
            for name, value in score(out.predictions, targets).items():
                results[metric_key(entry, split, name)] = value
            results[metric_key(entry, split, "loss")] = out.loss
            if accelerator.is_main_process:
                write_predictions(os.path.join(output_dir, f"predictions_{split}.tsv"), sources, out.predictions,
                                  targets)
        return results

    return evaluate
