"""UL2's mixture of denoisers (Tay et al. 2022, "UL2: Unifying Language Learning Paradigms", arXiv 2205.05131).

A denoiser is T5 span corruption with its own mean span length and noise density ("span"), or a
prefix LM ("prefix"), plus the mode token UL2 puts at the start of the encoder input. A mixture is
denoisers with sampling rates; each row of a batch draws its denoiser from the rates:

    denoisers, rates = parse_mixture("ul2")   # or a list of dicts, as a YAML file would hold them
    collate = DataCollatorForDenoiserMixture(tokenizer, input_length=512, denoisers=denoisers, rates=rates)
    # pack the corpus into chunks of collate.raw_length tokens; then, for each batch:
    batch = collate(examples)
    info = {key: batch.pop(key) for key in BATCH_INFO_KEYS}   # the model's forward takes the rest

The building blocks are the collators' (t5_training.collators: T5's lengths, masks, sentinel replacement,
prefix split; t5_training.row_keys: the rows' random keys), so every denoiser keeps its guarantees.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
import yaml

from t5_training.collators import (compute_input_and_target_lengths, corrupted_lengths, min_prefix_length,
                              random_prefix_split, replace_runs, sentinel_ids, shift_right, span_counts,
                              split_prefix, stack_chunks)
from t5_training.errors import UsageError, first_line
from t5_training.row_keys import DENOISER, RowRandomness, stream, uniforms
from t5_training.span_masks import random_spans_noise_masks

KINDS = ("span", "prefix")
# Per-row facts the trainer reads (loss per denoiser, exact tokens seen); pop them before model(**batch).
BATCH_INFO_KEYS = ("denoiser_ids", "num_raw_tokens")


@dataclasses.dataclass(frozen=True)
class Denoiser:
    """One objective: T5 span corruption ("span") or a prefix LM ("prefix"), and its mode token.

    For "prefix", noise_density is the average share of the chunk in the targets (T5's
    random_prefix_noise_mask: the prefix is uniform between (1 - 2 r) and all but one of the
    chunk's tokens), and there is no mean span length: the one span is the chunk's end.
    """

    name: str
    kind: str
    mean_noise_span_length: float | None
    noise_density: float
    mode_token: str

    def __post_init__(self):
        where = f"denoiser {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a denoiser needs a non-empty name, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"{where}: kind must be 'span' or 'prefix', got {self.kind!r}")
        if not isinstance(self.mode_token, str) or not self.mode_token:
            raise ValueError(f"{where}: mode_token must be a non-empty string such as '[NLU]', got "
                             f"{self.mode_token!r}")
        # T5's prefix mask puts at most half the chunk (on average) in the targets.
        fits = (lambda r: 0 < r <= 0.5) if self.kind == "prefix" else (lambda r: 0 < r < 1)
        if isinstance(self.noise_density, bool) or not isinstance(self.noise_density, (int, float)) \
                or not fits(self.noise_density):
            interval = "(0, 0.5]" if self.kind == "prefix" else "(0, 1)"
            raise ValueError(f"{where}: noise_density must be a number in {interval}, got {self.noise_density!r}")
        if self.kind == "prefix" and self.mean_noise_span_length is not None:
            raise ValueError(f"{where}: a prefix denoiser has one span, the chunk's end; leave "
                             "mean_noise_span_length out")
        if self.kind == "span" and (isinstance(self.mean_noise_span_length, bool)
                                    or not isinstance(self.mean_noise_span_length, (int, float))
                                    or not self.mean_noise_span_length >= 1):
            raise ValueError(f"{where}: mean_noise_span_length must be a number >= 1, got "
                             f"{self.mean_noise_span_length!r}")


def ul2_denoiser(name: str, mean: float | None, density: float, mode: str) -> Denoiser:
    return Denoiser(name, "prefix" if mean is None else "span", mean, density, mode)


# UL2's seven denoisers, §3.1.2 ("Mixture of Denoisers"): R = (μ=3, r=0.15) ∪ (μ=8, r=0.15);
# S = (μ=L/4, r=0.25, one span), a prefix LM; X = (μ=3, r=0.5) ∪ (μ=8, r=0.5) ∪ (μ=64, r=0.15) ∪
# (μ=64, r=0.5). "All tasks have an approximately equal participation in the mixture": 1/7 each.
# Mode tokens as in the released UL2 20B (§3.2, mode switching): [NLU] for R, [NLG] for X, [S2S] for S.
UL2_DENOISERS = (
    ul2_denoiser("R_3_0.15", 3.0, 0.15, "[NLU]"),
    ul2_denoiser("R_8_0.15", 8.0, 0.15, "[NLU]"),
    ul2_denoiser("S_0.25", None, 0.25, "[S2S]"),
    ul2_denoiser("X_3_0.5", 3.0, 0.5, "[NLG]"),
    ul2_denoiser("X_8_0.5", 8.0, 0.5, "[NLG]"),
    ul2_denoiser("X_64_0.15", 64.0, 0.15, "[NLG]"),
    ul2_denoiser("X_64_0.5", 64.0, 0.5, "[NLG]"),
)
UL2_RATES = (1 / 7,) * 7
# Every mode token UL2 uses; `python -m t5_training.tokenizer` puts them in every tokenizer it trains.
MODE_TOKENS = ("[NLU]", "[NLG]", "[S2S]")
MIXTURES = {"ul2": (UL2_DENOISERS, UL2_RATES)}
_FIELDS = ("name", "kind", "mean_noise_span_length", "noise_density", "mode_token", "rate")


def parse_mixture(spec) -> tuple[tuple[Denoiser, ...], tuple[float, ...]]:
    """(denoisers, rates) from a mixture's name ("ul2") or a list of dicts as a YAML file holds them:
    {name, kind, mean_noise_span_length (span only), noise_density, mode_token, rate}."""
    if isinstance(spec, str):
        if spec not in MIXTURES:
            raise ValueError(f"unknown mixture {spec!r}; known: {', '.join(sorted(MIXTURES))}, or a list of "
                             f"denoisers with the keys {', '.join(_FIELDS)}")
        return MIXTURES[spec]
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ValueError(f"a mixture is a name ({', '.join(sorted(MIXTURES))}) or a non-empty list of "
                         f"denoisers, got {spec!r}")
    denoisers, rates = [], []
    for i, entry in enumerate(spec):
        if not isinstance(entry, dict):
            raise ValueError(f"mixture entry {i} must be a mapping with the keys {', '.join(_FIELDS)}, got {entry!r}")
        label = f"mixture entry {i} ({entry.get('name', 'unnamed')})"
        unknown = sorted(set(entry) - set(_FIELDS))
        missing = [key for key in _FIELDS if key not in entry
                   and not (key == "mean_noise_span_length" and entry.get("kind") == "prefix")]
        if unknown or missing:
            raise ValueError(f"{label}: " + "; ".join(
                part for part in (f"unknown keys {unknown} (the keys are {', '.join(_FIELDS)})" if unknown else "",
                                  f"missing {', '.join(missing)}" if missing else "") if part))
        rate = entry["rate"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise ValueError(f"{label}: rate must be a number > 0, got {rate!r}")
        denoisers.append(Denoiser(**{key: entry.get(key) for key in _FIELDS[:-1]}))
        rates.append(float(rate))
    names = [d.name for d in denoisers]
    if len(set(names)) != len(names):
        raise ValueError(f"denoiser names must be unique (they label the loss per denoiser), got {names}")
    return tuple(denoisers), tuple(rates)


def read_mixture(path: str | None) -> tuple[tuple[Denoiser, ...], tuple[float, ...]]:
    """(denoisers, rates): UL2's seven at equal rates, or the list the YAML file at `path` holds."""
    if path is None:
        return parse_mixture("ul2")
    try:
        with open(path, encoding="utf-8") as f:
            return parse_mixture(yaml.safe_load(f))
    except OSError as err:
        raise UsageError(f"--denoisers {path}: {err.strerror}; pass a YAML file that lists the denoisers") from None
    except (yaml.YAMLError, ValueError) as err:
        raise UsageError(f"--denoisers {path}: {first_line(err)}") from None


def mixture_lengths(input_length: int, denoisers) -> tuple[list[int], list[int], list[int]]:
    """(raw chunk length, target length, encoder input length) of each denoiser, all with EOS and the
    mode token in an `input_length`-token input (a prefix LM's input is its longest)."""
    raw_lengths, target_lengths, input_lengths = [], [], []
    for d in denoisers:
        if d.kind == "span":  # T5's lengths for the input after the mode token
            raw, target = compute_input_and_target_lengths(input_length - 1, d.noise_density,
                                                           d.mean_noise_span_length)
            # T5's helper counts in Python floats, its mask in float32: where the mask's input is the
            # longer, a shorter chunk keeps every row at input_length; its targets may be the longer.
            while corrupted_lengths(raw, d.noise_density, d.mean_noise_span_length)[0] > input_length - 1:
                raw -= 1
            corrupted, masked_target = corrupted_lengths(raw, d.noise_density, d.mean_noise_span_length)
            target = max(target, masked_target)
        else:  # mode token + longest prefix + EOS fit
            raw = corrupted = input_length - 1
            target = raw - min_prefix_length(raw, d.noise_density) + 1
        raw_lengths.append(raw)
        target_lengths.append(target)
        input_lengths.append(1 + corrupted)
    return raw_lengths, target_lengths, input_lengths


def denoiser_record(denoisers, rates, input_length: int) -> dict:
    """What a mixture of denoisers draws from, as a checkpoint records it (TrainState.mixture)."""
    return {"input_length": input_length, "denoisers": [{**dataclasses.asdict(d), "rate": float(r)}
                                                        for d, r in zip(denoisers, rates)]}


def check_same_denoisers(saved: dict, now: dict, path: str) -> None:
    """Refuses to resume from a checkpoint that drew from another mixture or another input length, or that
    UL2 made and another objective resumes (or the other way round; other objectives record no mixture):
    its batches, masks and packed chunks would not be the ones an uninterrupted run sees next."""
    if saved == now:
        return

    def show(m):
        total = sum(d["rate"] for d in m["denoisers"]) or 1
        return ", ".join(f"{d['name']} {100 * d['rate'] / total:.0f}%" for d in m["denoisers"]) + \
            f" at {m['input_length']} tokens"

    new_run = "or start a new run from its weights with --model_name_or_path"
    if not now:  # span corruption or prefix LM, which draw from no mixture
        raise UsageError(f"checkpoint {path} was pretrained with --objective ul2 ({show(saved)}) and this run "
                         f"has another objective; resume with --objective ul2, its --denoisers file (unchanged) "
                         f"and --max_seq_length, " + new_run)
    if not saved:
        raise UsageError(f"checkpoint {path} was pretrained with another objective than this run's --objective ul2 "
                         f"({show(now)}); resume with the checkpoint's --objective, " + new_run)
    raise UsageError(f"checkpoint {path} was pretrained on another mixture of denoisers ({show(saved)}) than "
                     f"this run's ({show(now)}); resume with its --denoisers file (unchanged) and --max_seq_length, "
                     + new_run)


def missing_mode_tokens(tokenizer, denoisers) -> list[str]:
    """The denoisers' mode tokens that are not one token of the tokenizer's vocabulary, sorted."""
    vocab = tokenizer.get_vocab()
    return sorted({d.mode_token for d in denoisers if d.mode_token not in vocab})


class DataCollatorForDenoiserMixture:
    """Packed chunks of `raw_length` tokens -> batches in which each row has its own denoiser.

    Every row's encoder input is exactly `input_length` tokens: its mode token, then the corrupted
    chunk and EOS. A span denoiser reads the raw chunk length T5's helper gives for `input_length - 1`
    (padded, and masked out of attention, only after T5's density-0.5 adjustment); the prefix
    denoiser reads `input_length - 1` tokens, so that mode token + longest prefix + EOS fit, and pads
    shorter prefixes. Labels are padded with -100 to the longest target of the denoisers drawn for
    the batch; decoder_input_ids are the labels shifted right behind <pad>.

    The corpus packs every chunk to `raw_length`, the longest raw length of the denoisers, and each
    row uses only its first `raw_lengths[d]` tokens, returned per row as "num_raw_tokens" (with
    "denoiser_ids", the row's index into `denoisers`); both are BATCH_INFO_KEYS, to pop before the
    model's forward. With UL2's default at equal rates this drops 29.7% of the packed tokens at
    input_length 128 (rows of 127..248 raw tokens) and at 512 (511..1004).

    A row's denoiser, mask and prefix split come from its own key, a pure function of (seed, its
    "idx"): the same whichever rows share its batch (a resume under another split of the global
    batch repeats them), and never repeated by another row, worker or process.
    """

    def __init__(self, tokenizer, *, input_length: int, denoisers, rates, seed: int = 0):
        denoisers, rates = tuple(denoisers), np.asarray(rates, dtype=np.float64)
        if not denoisers or len(rates) != len(denoisers):
            raise ValueError(f"give one rate per denoiser: {len(denoisers)} denoisers, {len(rates)} rates")
        if not np.all(rates > 0):
            raise ValueError(f"rates must all be > 0, got {rates.tolist()}")
        if input_length < 4:
            raise ValueError(f"input_length must be at least 4 (mode token, text, EOS), got {input_length}")
        self.input_length, self.denoisers, self.rates = input_length, denoisers, rates / rates.sum()
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id
        self.decoder_start_token_id = tokenizer.pad_token_id
        vocab = tokenizer.get_vocab()
        missing = missing_mode_tokens(tokenizer, denoisers)
        if missing:
            raise ValueError(f"the tokenizer has no single token for the mode tokens {missing}; add them with "
                             f"tokenizer.add_special_tokens({{'additional_special_tokens': {missing}}}), save it, "
                             "and resize the model's embeddings (model.resize_token_embeddings(len(tokenizer)))")
        self.mode_ids = np.asarray([vocab[d.mode_token] for d in denoisers], dtype=np.int64)
        self.raw_lengths, self.target_lengths, self._input_lengths = mixture_lengths(input_length, denoisers)
        self.raw_length, self.target_length = max(self.raw_lengths), max(self.target_lengths)
        # Arrays of the per-denoiser lengths, to index with a batch's denoiser ids.
        self._raw, self._target, self._input_lengths = (
            np.asarray(x, np.int64) for x in (self.raw_lengths, self.target_lengths, self._input_lengths))
        self._is_span = np.asarray([d.kind == "span" for d in denoisers])
        # (noise, kept, spans) of each span denoiser's chunk; zeros for prefix LMs, never read.
        self._span_counts = np.asarray([span_counts(raw, d.noise_density, d.mean_noise_span_length)
                                        if d.kind == "span" else (0, 0, 0)
                                        for d, raw in zip(denoisers, self.raw_lengths)], np.int64)
        spans = {d.name: int(counts[2]) for d, counts in zip(denoisers, self._span_counts) if d.kind == "span"}
        self.sentinel_ids = sentinel_ids(tokenizer) if spans else np.zeros(0, np.int64)
        if spans and max(spans.values()) > len(self.sentinel_ids):
            name = max(spans, key=spans.get)
            raise ValueError(f"denoiser {name!r} puts {spans[name]} noise spans in a {input_length}-token input, "
                             f"but the tokenizer has only {len(self.sentinel_ids)} sentinels (<extra_id_0>.."
                             f"<extra_id_{len(self.sentinel_ids) - 1}>); add more, shorten input_length, "
                             "or drop that denoiser")
        self._cumulative_rates = np.cumsum(self.rates)
        self._cumulative_rates[-1] = 1.0  # so that every uniform draw in [0, 1) falls below the last
        self._keys = RowRandomness(seed)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        tokens = stack_chunks(examples, self.raw_length)
        keys = self._keys(examples)
        ids = np.searchsorted(self._cumulative_rates, uniforms(stream(keys, DENOISER), 0), side="right")
        input_ids = np.full((len(tokens), self.input_length), self.pad_token_id, np.int64)
        input_ids[:, 0] = self.mode_ids[ids]
        attention_mask = (np.arange(self.input_length) < self._input_lengths[ids][:, None]).astype(np.int64)
        labels = np.full((len(tokens), self._target[ids].max()), -100, np.int64)
        # All span rows in one vectorised pass, whatever their denoisers: a pass per denoiser costs
        # its numpy calls' fixed overhead up to seven times, more than the work itself at batch 64.
        # The rows' own tokens lie end to end, so the rows of short chunks pay for no padding.
        rows = np.flatnonzero(self._is_span[ids])
        if len(rows):
            noise, kept, spans = self._span_counts[ids[rows]].T
            lengths = noise + kept
            # Straight from the packed rows: a copy of the span rows first costs as much again.
            used = np.zeros(tokens.shape, dtype=bool)
            used[rows] = np.arange(tokens.shape[1]) < lengths[:, None]
            flat = np.compress(used.reshape(-1), tokens.reshape(-1))
            mask = random_spans_noise_masks(keys[rows], lengths, noise, spans)
            input_ids[rows, 1:] = replace_runs(flat, mask, self.input_length - 1, self.pad_token_id,
                                               self.sentinel_ids, self.eos_token_id, lengths)
            labels[rows, :] = replace_runs(flat, ~mask, labels.shape[1], -100, self.sentinel_ids,
                                           self.eos_token_id, lengths)
        for i in np.unique(ids[~self._is_span[ids]]):  # prefix LMs: cheap, one pass each
            rows, d = np.flatnonzero(ids == i), self.denoisers[i]
            split = random_prefix_split(keys[rows], len(rows), self.raw_lengths[i], d.noise_density)
            prefix, attention, rest = split_prefix(tokens[rows, :self.raw_lengths[i]], split, self.eos_token_id,
                                                   self.pad_token_id)
            input_ids[rows, 1:], attention_mask[rows, 1:] = prefix, attention
            labels[rows, :self.target_lengths[i]] = rest[:, :self.target_lengths[i]]
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(labels),
            "decoder_input_ids": torch.from_numpy(shift_right(labels, self.decoder_start_token_id)),
            "denoiser_ids": torch.from_numpy(ids.astype(np.int64)),
            "num_raw_tokens": torch.from_numpy(self._raw[ids]),
        }
