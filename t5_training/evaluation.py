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
from transformers.masking_utils import create_causal_mask
from transformers.modeling_outputs import BaseModelOutput

from t5_training import adapters, no_label, one_label
from t5_training.batching import shift_right
from t5_training.data import in_row_order
from t5_training.errors import UsageError
from t5_training.losses import row_cross_entropy
from t5_training.sharding import root_weights_gathered, shards_weights
from t5_training.tasks import kind_of, make_scorer, metric_key, target_text


@dataclass(frozen=True)
class SplitPredictions:
    predictions: list[str]
    loss: float


def resolve_decoding(requested: str, entry, accelerator) -> str:
    """`--eval_decoding`: 'score' for classification (where it gives greedy's exact predictions), else 'generate'."""
    # With sharded weights every process must run the same forward passes, which generation
    # already arranges (synced_gpus) and the scorer's fallback to generation would not.
    closed = kind_of(entry).closed_label_set
    scorable = closed and not shards_weights(accelerator)
    if requested == "score" and not scorable:
        why = "with sharded weights (ZeRO-3, FSDP)" if closed else f"for a {entry.kind} task"
        raise UsageError(f"--eval_decoding score scores label candidates, which does not work {why}; "
                         "use --eval_decoding generate (or auto)")
    if requested == "auto":
        return "score" if scorable else "generate"
    return requested


def label_candidates(entry, tokenizer, max_target_length: int) -> torch.Tensor:
    """(labels, longest) token ids of every label word as the model is trained on it, with EOS, padded with -100."""
    ids = [tokenizer(target_text(entry, k), add_special_tokens=True)["input_ids"]
           for k in range(len(entry.label_words))]
    ids = [row if len(row) <= max_target_length else row[: max_target_length - 1] + [tokenizer.eos_token_id]
           for row in ids]
    out = torch.full((len(ids), max(map(len, ids))), -100, dtype=torch.long)
    for k, row in enumerate(ids):
        out[k, : len(row)] = torch.tensor(row)
    return out


class GreedyDecoder:
    """Greedy predictions and teacher-forced loss of a batch, by generation or by scoring label candidates.

    The encoder runs once per batch; the loss's decoder pass, and generation or scoring, reuse
    its output. Scoring runs the decoder once over every candidate, teacher-forced: a row's
    candidates sit side by side in one decoder sequence, each attending only to itself
    (`candidate_blocks_mask`), so the row's encoder output is projected to cross-attention keys
    and values once, not once per candidate. Greedy
    decoding produces candidate c exactly when, at every position of c, c's next token is the
    argmax given c's prefix, and the logits of that one pass hold every such argmax. So a row
    whose argmaxes follow a candidate all the way (EOS included) gets that candidate, which is
    what generation returns. The rows that follow no candidate (an untrained model, or a label
    spelt with other tokens) are generated, so predictions always equal greedy generation's;
    only the time differs.
    """

    def __init__(self, accelerator, tokenizer, max_new_tokens: int, candidates: torch.Tensor | None = None):
        self.accelerator = accelerator
        self.pad = tokenizer.pad_token_id
        self.max_new_tokens = max_new_tokens
        self.candidates = None if candidates is None else candidates.to(accelerator.device)
        self.generated_rows = 0
        self._blocks_mask: tuple[tuple, torch.Tensor] | None = None  # (what its form depends on, mask)

    def __call__(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(predicted token ids padded with the pad id, per-row summed target loss, per-row target tokens)."""
        # FSDP's root weights are gathered around the direct calls below (sharding.py).
        with root_weights_gathered(model):
            return self._decode(model, batch, synced=shards_weights(self.accelerator, model))

    def _decode(self, model, batch: dict, synced: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The encoder runs once here (with a prompt-tuned model's soft tokens in front), and
        # the decoder passes below call the transformers model under any peft wrapper.
        # Without torch.compile's wrapper too, which would hide a peft model from the checks on its type.
        plain = self.accelerator.unwrap_model(model, keep_torch_compile=False)
        encoded, mask = adapters.encode(plain, batch["input_ids"], batch["attention_mask"])
        unwrapped = adapters.base_model(plain)
        if self.candidates is None:
            row_loss, row_tokens = self._teacher_forced(unwrapped, encoded, mask, batch)
            everything = torch.ones(len(mask), dtype=torch.bool, device=mask.device)
            return self._generate(unwrapped, encoded, mask, everything, synced), row_loss, row_tokens

        (k, width), rows = self.candidates.shape, len(mask)
        labels = self.candidates.repeat(rows, 1)  # row r's candidate c at r * k + c
        decoder_input_ids = shift_right(labels, unwrapped.config.decoder_start_token_id, self.pad)
        logits = unwrapped(encoder_outputs=(encoded,), attention_mask=mask,
                           decoder_input_ids=decoder_input_ids.view(rows, k * width),
                           decoder_attention_mask=self._candidate_mask(unwrapped)).logits
        logits = logits.view(rows * k, width, -1)
        follows = ((logits.argmax(dim=-1) == labels) | (labels == -100)).all(dim=-1).view(rows, k)
        chosen = self.candidates[follows.int().argmax(dim=1)]
        predicted = chosen.masked_fill(chosen == -100, self.pad)
        # A row's target is one of the candidates (unless it has none, like a test split's
        # <unk>), so its loss is already in these logits: no second decoder pass.
        target = self._target_candidate(batch["labels"])
        if target is None:
            row_loss, row_tokens = self._teacher_forced(unwrapped, encoded, mask, batch)
        else:
            candidate_loss, candidate_tokens = row_cross_entropy(logits, labels)
            pick = torch.arange(rows, device=mask.device) * k + target
            row_loss, row_tokens = candidate_loss[pick], candidate_tokens[pick]
        unmatched = ~follows.any(dim=1)
        if not unmatched.any():
            return predicted, row_loss, row_tokens
        generated = self._generate(unwrapped, encoded, mask, unmatched, synced)
        width = max(width, generated.size(1))
        predicted = F.pad(predicted, (0, width - predicted.size(1)), value=self.pad)
        predicted[unmatched] = F.pad(generated, (0, width - generated.size(1)), value=self.pad)
        return predicted, row_loss, row_tokens

    def _candidate_mask(self, unwrapped) -> torch.Tensor:
        # The same for every batch: built again only if the attention implementation, dtype or
        # device it is made for changes.
        weight = unwrapped.get_input_embeddings().weight
        key = (unwrapped.config._attn_implementation, weight.dtype, weight.device)
        if self._blocks_mask is None or self._blocks_mask[0] != key:
            self._blocks_mask = (key, candidate_blocks_mask(unwrapped, *self.candidates.shape))
        return self._blocks_mask[1]

    def _teacher_forced(self, unwrapped, encoded, mask, batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = unwrapped(encoder_outputs=(encoded,), attention_mask=mask,
                           decoder_input_ids=batch["decoder_input_ids"]).logits
        return row_cross_entropy(logits, batch["labels"])

    def _target_candidate(self, labels: torch.Tensor) -> torch.Tensor | None:
        """Per row, the index of the candidate equal to its labels; None unless every row has one."""
        width = self.candidates.size(1)
        if labels.size(1) < width:
            labels = F.pad(labels, (0, width - labels.size(1)), value=-100)
        beyond = (labels[:, width:] == -100).all(dim=1, keepdim=True)
        same = (labels[:, None, :width] == self.candidates[None]).all(dim=2) & beyond
        if not same.any(dim=1).all():
            return None
        return same.int().argmax(dim=1)

    def _generate(self, unwrapped, encoded: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
                  synced: bool) -> torch.Tensor:
        self.generated_rows += int(rows.sum())
        generated = unwrapped.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoded[rows]), attention_mask=mask[rows],
            max_new_tokens=self.max_new_tokens, num_beams=1, do_sample=False,
            # With sharded weights every process must run the same number of forward passes.
            synced_gpus=synced,
        )
        return generated[:, 1:]  # without the decoder start token


def candidate_blocks_mask(model, blocks: int, width: int):
    """The decoder self-attention mask of `blocks` sequences of `width` tokens laid end to end.

    Each position attends causally within its own block and never to another, so every block's
    logits are those of the block decoded alone: T5's self-attention bias depends only on the
    distance between two positions, which is the same inside a block wherever the block sits,
    and its cross-attention has no position bias. Built by transformers' own mask factory, so it
    has the form the model's attention implementation expects (boolean for SDPA, additive for
    eager), with a batch of one that broadcasts over the rows.
    """
    decoder = model.get_decoder()

    def same_block(batch_idx, head_idx, q_idx, kv_idx):
        return q_idx // width == kv_idx // width

    shape_only = torch.empty((1, blocks * width, 1), dtype=decoder.get_input_embeddings().weight.dtype,
                             device=decoder.get_input_embeddings().weight.device)
    # The cache by position: transformers renamed its keyword (past_key_values, then cache, the old
    # name warned of and due to go), and the GPU image's release knows only the old one.
    return create_causal_mask(decoder.config, shape_only, None, None, and_mask_function=same_block)


def decode_texts(tokenizer, generated) -> list[str]:
    """Generated ids as text, as T5's SentencePiece decode writes them, so that label matching (exact, as
    T5's) sees the same strings: transformers' decode keeps the space of a leading "▁" piece, which
    SentencePiece drops, and both keep a trailing one ("positive " is no label for T5)."""
    return [text.lstrip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]


def decode_split(accelerator, model, loader, tokenizer, num_rows: int, decoder: GreedyDecoder) -> SplitPredictions:
    """Greedy predictions for every row of a split (in row order) and the teacher-forced loss."""
    predictions: list[str | None] = [None] * num_rows
    loss_sum, token_count = 0.0, 0
    with torch.no_grad(), accelerator.autocast():
        for batch in loader:
            generated, row_loss, row_tokens = decoder(model, batch)
            generated = accelerator.pad_across_processes(generated, dim=1, pad_index=tokenizer.pad_token_id)
            idx, generated, row_loss, row_tokens = accelerator.gather_for_metrics(
                (batch["idx"], generated, row_loss, row_tokens)
            )
            loss_sum += float(row_loss.sum())
            token_count += int(row_tokens.sum())
            for i, text in zip(idx.tolist(), decode_texts(tokenizer, generated)):
                predictions[i] = text
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


def make_generation_evaluator(accelerator, entry, task, eval_loaders: dict, tokenizer, output_dir: str,
                              decoding: str = "generate", max_target_length: int = 512,
                              rouge_use_stemmer: bool = False, file_prefix: str = ""):
    """`evaluate(model) -> {metric key: value}` for every eval split of a task, decoding greedily.

    `decoding` is 'generate' or 'score' (see `GreedyDecoder`; `resolve_decoding` picks it),
    with label candidates cut to `max_target_length` as the training targets are.

    Keys follow `tasks.metric_key` ("accuracy", or "validation_matched/accuracy" when a task
    has several eval splits), plus the split's teacher-forced "loss" and, for a task with labels, its
    outputs that name no label (`no_label`, `no_label_share`: no_label.counts) and, for a classification
    task, how much of its output is one label (`top_label_share`, `one_label`: one_label.counts). Each
    call also rewrites `output_dir/predictions_<file_prefix><split>.tsv` (a mixture's prefix is its
    task's name and "_"). `rouge_use_stemmer` stems before ROUGE (T5 does not).
    """
    score = make_scorer(entry, rouge_use_stemmer)
    # Reports list rows in their original order; the loaders see them sorted by length.
    texts = {split: (in_row_order(ds, "source"), in_row_order(ds, "target")) for split, ds in task.evals.items()}

    candidates = label_candidates(entry, tokenizer, max_target_length) if decoding == "score" else None
    decoder = GreedyDecoder(accelerator, tokenizer, task.max_target_tokens, candidates)

    def evaluate(model) -> dict:
        results = {}
        for split, loader in eval_loaders.items():
            sources, targets = texts[split]
            out = decode_split(accelerator, model, loader, tokenizer, len(sources), decoder)
            for name, value in {**score(out.predictions, targets), **no_label.counts(entry, out.predictions),
                                **one_label.counts(entry, out.predictions, targets)}.items():
                results[metric_key(entry, split, name)] = value
            results[metric_key(entry, split, "loss")] = out.loss
            if accelerator.is_main_process:
                write_predictions(os.path.join(output_dir, f"predictions_{file_prefix}{split}.tsv"), sources,
                                  out.predictions, targets)
        return results

    return evaluate


def make_test_predictor(accelerator, entry, tests: dict, loaders: dict, tokenizer, output_dir: str,
                        decoding: str = "generate", max_target_length: int = 512, max_new_tokens: int = 8,
                        file_prefix: str = ""):
    """`predict(model) -> {split: predicted texts in row order}` for unlabelled splits (submission.build_test_data).

    Decodes as `make_generation_evaluator` does, at most `max_new_tokens` (the eval references'
    longest) or, for classes, the longest label word: test rows have no reference to size by.
    Each call rewrites `output_dir/predictions_<file_prefix><split>.tsv`, with an empty reference column.
    """
    candidates = label_candidates(entry, tokenizer, max_target_length) if kind_of(entry).closed_label_set else None
    longest = max(max_new_tokens, 0 if candidates is None else candidates.size(1))
    decoder = GreedyDecoder(accelerator, tokenizer, longest, candidates if decoding == "score" else None)
    sources = {split: in_row_order(ds, "source") for split, ds in tests.items()}

    def predict(model) -> dict[str, list[str]]:
        model.eval()
        predictions = {}
        for split, loader in loaders.items():
            predictions[split] = decode_split(accelerator, model, loader, tokenizer, len(sources[split]),
                                              decoder).predictions
            if accelerator.is_main_process:
                write_predictions(os.path.join(output_dir, f"predictions_{file_prefix}{split}.tsv"), sources[split],
                                  predictions[split], [""] * len(sources[split]))
        return predictions

    return predict
