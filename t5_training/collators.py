"""Batch collators for T5 pretraining: span corruption (T5's main objective) and prefix LM.

Definitions follow Google's T5 `t5/data/preprocessors.py`:
  * `compute_input_and_target_lengths` is `random_spans_helper` with one sentinel per span in
    inputs and targets (what `span_corruption` passes);
  * `random_spans_noise_mask` is `random_spans_noise_mask` with `_random_segmentation`
    (without `random_roll`), batched; each row draws from its own key (t5_training.row_keys), a
    function of (seed, its "idx"), so its mask is the same whichever rows share its batch;
  * `DataCollatorForT5MLM` applies `noise_span_to_unique_sentinel` to build inputs and
    `nonnoise_span_to_unique_sentinel` to build targets, then appends EOS;
  * `DataCollatorForPrefixLM` is `prefix_lm` (`random_prefix_noise_mask`, inputs = prefix,
    targets = the rest).
Everything is vectorised over the batch with numpy; only numpy, torch, the standard library and
the rows' keys (t5_training.row_keys, which imports nothing of the project) are used, and the
tokenizer is passed in. UL2's mixture of denoisers (t5_training/denoisers.py) is
built from this module's public functions. Users import the collators from data_collator_t5.py.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from t5_training.row_keys import KEPT_CUTS, NOISE_CUTS, PREFIX_SPLIT, RowRandomness, keys_for, stream, uniforms


def span_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int, int]:
    """(num_noise, num_nonnoise, num_spans) of T5's noise mask over a chunk of `length` tokens, bit for bit."""
    # T5's mask rounds half to even in float32: round(float32(length) * density), round(float32(noise)
    # / mean). float64 differs at some lengths (190 * 0.15: 28.5 -> 28, not 28.500001 -> 29).
    f32 = np.float32
    num_noise = min(max(int(np.round(f32(length) * f32(noise_density))), 1), length - 1)
    num_nonnoise = length - num_noise
    # Both counts stay positive. Noise and non-noise spans alternate, so each side needs a token per
    # span: above density mean / (mean + 1) (0.75 at mean 3) T5's segmentation fails, and the spans
    # are capped at the non-noise tokens instead (the mean noise span then grows past the mean).
    num_spans = min(max(1, int(np.round(f32(num_noise) / f32(mean_noise_span_length)))), num_nonnoise)
    return num_noise, num_nonnoise, num_spans


def corrupted_lengths(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(input length, target length), EOS included, of a span-corrupted chunk of `length` tokens."""
    num_noise, num_nonnoise, num_spans = span_counts(length, noise_density, mean_noise_span_length)
    return num_nonnoise + num_spans + 1, num_noise + num_spans + 1  # +1: EOS


def _helper_lengths(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(input length, target length) as T5's random_spans_helper counts them: Python floats, no clamping."""
    num_noise = int(round(length * noise_density))
    num_spans = int(round(num_noise / mean_noise_span_length))
    return length - num_noise + num_spans + 1, num_noise + num_spans + 1


def compute_input_and_target_lengths(inputs_length: int, noise_density: float,
                                     mean_noise_span_length: float) -> tuple[int, int]:
    """T5's random_spans_helper: (raw chunk length, target length incl. EOS) for `inputs_length`, counted
    as it counts, in Python floats (its mask's float32 can differ: see DataCollatorForT5MLM)."""
    # Corrupted input length grows by 0 or 1 per extra raw token, so the largest raw length whose
    # input still fits gives an input of exactly `inputs_length`: no padding, no wasted compute.
    tokens_length = inputs_length - 1
    while _helper_lengths(tokens_length + 1, noise_density, mean_noise_span_length)[0] <= inputs_length:
        tokens_length += 1
    input_len, targets_length = _helper_lengths(tokens_length, noise_density, mean_noise_span_length)
    # T5's hack: at density 0.5 make the targets no longer than the (round-number) inputs. The
    # shortened chunk can then corrupt to one token less than inputs_length; the collator pads.
    if noise_density == 0.5 and targets_length > input_len:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def _segment_bounds(keys: np.ndarray, num_items: int, num_segments: int) -> np.ndarray:
    """(rows, num_segments + 1) bounds 0 < ... < num_items of segments of positive length, uniform
    over compositions, row r's from keys[r] alone: segment j holds items bounds[j] to bounds[j + 1] - 1."""
    gaps, cuts, rows = num_items - 1, num_segments - 1, len(keys)
    wanted = min(cuts, gaps - cuts)  # where most gaps are cut, draw the uncut ones
    # A row cuts the first `wanted` distinct gaps it draws (as t5_training.span_masks does): every set
    # equally likely, as T5's shuffle makes them, in fewer numbers than a shuffle. Draws: the coupon
    # collector's mean plus 4 deviations, doubled in the rare case a row falls short.
    mean = gaps * math.log(gaps / (gaps - wanted)) if wanted else 0.0
    draws = int(mean + 4 * math.sqrt(mean)) + 8
    while True:
        picks = (uniforms(keys[:, None], np.arange(draws)) * gaps).astype(np.int64)  # uniform to within 2^-53
        # A stable sort puts a gap's first draw before its repeats; flat indices beat take_along_axis.
        order = (np.argsort(picks, axis=1, kind="stable") + draws * np.arange(rows)[:, None]).reshape(-1)
        ranked = picks.reshape(-1)[order]
        first = np.empty(len(order), dtype=bool)
        first[order] = np.concatenate([[True], ranked[1:] != ranked[:-1]]) | (np.arange(len(order)) % draws == 0)
        first = first.reshape(rows, draws)
        if np.all(first.sum(axis=1) >= wanted):
            break
        draws *= 2
    chosen = np.zeros((rows, gaps), dtype=bool)
    taken = first & (np.cumsum(first, axis=1) <= wanted)
    chosen[np.nonzero(taken)[0], picks[taken]] = True
    bounds = np.empty((rows, num_segments + 1), np.int64)
    bounds[:, 0], bounds[:, -1] = 0, num_items
    if cuts:  # flatnonzero, row-major so sorted within each row
        bounds[:, 1:-1] = np.flatnonzero(chosen if wanted == cuts else ~chosen).reshape(rows, cuts) % gaps + 1
    return bounds


def random_spans_noise_mask(batch_size: int, length: int, noise_density: float,
                            mean_noise_span_length: float, rng) -> np.ndarray:
    """Bool (batch_size, length) T5 noise masks: exact noise/span counts, all masks equally likely, each
    row's from its own key (`rng`: one uint64 key per row, row_keys, or a numpy Generator to draw them)."""
    num_noise, num_nonnoise, num_spans = span_counts(length, noise_density, mean_noise_span_length)
    keys = keys_for(rng, batch_size)
    noise = _segment_bounds(stream(keys, NOISE_CUTS), num_noise, num_spans)
    kept = _segment_bounds(stream(keys, KEPT_CUTS), num_nonnoise, num_spans)
    # Kept text first, so every mask starts with kept text and (as in T5) ends with a noise span:
    # noise span j starts after kept segments 0..j and noise segments 0..j-1, and ends after both 0..j.
    flips = np.concatenate([kept[:, 1:] + noise[:, :-1], kept[:, 1:-1] + noise[:, 1:-1]], axis=1)
    starts = np.zeros((batch_size, length), dtype=bool)
    starts.reshape(-1)[flips + length * np.arange(batch_size)[:, None]] = True  # flat: cheaper than put_along_axis
    return toggled(starts)


def toggled(flips: np.ndarray) -> np.ndarray:
    """Bool array, True from each odd-numbered True of a row of `flips` until the next one (excluded)."""
    # A running count's parity: twice as fast as np.logical_xor.accumulate along rows.
    return (np.cumsum(flips, axis=1, dtype=np.int32) & 1).astype(bool)


def stack_chunks(examples: list[dict], length: int) -> np.ndarray:
    """(batch, length) int64 token ids of the examples' packed chunks; ValueError on any other length."""
    if not examples:
        raise ValueError("cannot collate an empty batch")
    try:  # one conversion for the whole batch: a third of the time of one per row
        tokens = np.array([ex["input_ids"] for ex in examples], dtype=np.int64)
    except ValueError:  # rows of different lengths: the loop below names the first bad one
        tokens = None
    if tokens is not None and tokens.shape == (len(examples), length):
        return tokens
    for i, ex in enumerate(examples):
        shape = np.shape(ex["input_ids"])
        if shape != (length,):
            raise ValueError(f"example {i} has input_ids of shape {shape}; expected exactly {length} "
                             "token ids (a packed chunk of raw_length tokens, without EOS or padding)")
    raise ValueError(f"input_ids must be {length} integer token ids per example")


def shift_right(labels: np.ndarray, start_id: int) -> np.ndarray:
    """T5's decoder inputs: labels shifted right behind `start_id`, with -100 read as `start_id`."""
    shifted = np.concatenate([np.full((len(labels), 1), start_id, np.int64), labels[:, :-1]], axis=1)
    return np.where(shifted == -100, start_id, shifted)


def sentinel_ids(tokenizer, num_sentinels: int | None = None) -> np.ndarray:
    """Ids of <extra_id_0>, <extra_id_1>, ... (all of them, or the first `num_sentinels`)."""
    # By name: their ids depend on how the vocabulary was built (T5 puts them at the top in
    # decreasing order, but an enlarged or custom vocabulary need not).
    vocab = tokenizer.get_vocab()
    found = []
    while f"<extra_id_{len(found)}>" in vocab and (num_sentinels is None or len(found) < num_sentinels):
        found.append(vocab[f"<extra_id_{len(found)}>"])
    if not found:
        raise ValueError("tokenizer has no sentinel token <extra_id_0>; span corruption needs "
                         "<extra_id_0>, <extra_id_1>, ... in its vocabulary")
    if num_sentinels is not None and len(found) < num_sentinels:
        raise ValueError(f"num_sentinels={num_sentinels} but the tokenizer only has <extra_id_0>.."
                         f"<extra_id_{len(found) - 1}>")
    return np.asarray(found, dtype=np.int64)


def replace_runs(tokens: np.ndarray, runs: np.ndarray, out_length: int, fill: int, sentinels: np.ndarray,
                 eos_token_id: int, lengths: np.ndarray | None = None) -> np.ndarray:
    """(rows, out_length): each row's tokens with each run of True in `runs` replaced by a sentinel (the
    row's i-th run by the i-th sentinel), then EOS, padded with `fill`.

    `tokens` and `runs` are (rows, width) arrays, or, given `lengths`, flat arrays holding rows of
    lengths[r] tokens end to end (so rows of different lengths pay for no padding).
    """
    if lengths is None:
        lengths = np.full(len(tokens), tokens.shape[1])
        tokens, runs = tokens.reshape(-1), runs.reshape(-1)
    row_starts = np.cumsum(lengths) - lengths
    prev = np.empty_like(runs)  # runs shifted right by one, within each row
    prev[1:] = runs[:-1]
    prev[row_starts] = False
    first = runs & ~prev
    kept = ~(runs & prev)
    # np.compress: several times faster than boolean indexing (which branches per element) and
    # than np.where over every token; sentinels are then written at the run starts only.
    values = np.compress(kept, tokens)
    starts = np.flatnonzero(np.compress(kept, first))
    runs_per_row = np.add.reduceat(first, row_starts, dtype=np.int64)
    # A run start's rank within its row: its rank among all starts less the starts of earlier rows.
    values[starts] = sentinels[np.arange(len(starts)) - np.repeat(np.cumsum(runs_per_row) - runs_per_row,
                                                                  runs_per_row)]
    counts = np.add.reduceat(kept, row_starts, dtype=np.int64)
    out = np.full((len(lengths), out_length), fill, np.int64)
    if np.all(counts == counts[0]):
        out[:, :counts[0]] = values.reshape(len(lengths), -1)
    else:
        np.place(out, np.arange(out_length) < counts[:, None], values)  # row-major, as `values` is
    out[np.arange(len(lengths)), counts] = eos_token_id
    return out


def min_prefix_length(length: int, noise_density: float = 0.5) -> int:  # pragma: no mutate
    """The shortest prefix T5's random_prefix_noise_mask gives a chunk of `length` (at least 1)."""
    # In float32, as T5's tf.math.round((1 - 2 * density) * float32(length - 1)): 0.7 * 45 is 31.5
    # there (-> 32), 31.499999999999996 in Python's floats.
    shortest = np.round(np.float32(1 - 2 * noise_density) * np.float32(length - 1))
    return min(length - 1, max(1, int(shortest)))


def random_prefix_split(rng, batch_size: int, length: int, noise_density: float = 0.5) -> np.ndarray:
    """(batch_size, 1) prefix lengths, uniform from min_prefix_length to length - 1 as T5's
    random_prefix_noise_mask: targets average a `noise_density` share of the chunk, neither side empty.
    Each row's from its own key (`rng`: one uint64 key per row, row_keys, or a numpy Generator to draw them)."""
    shortest = min_prefix_length(length, noise_density)
    u = uniforms(stream(keys_for(rng, batch_size), PREFIX_SPLIT), 0)
    return shortest + (u * (length - shortest)).astype(np.int64)[:, None]  # uniform to within 2^-53


def split_prefix(tokens: np.ndarray, split: np.ndarray, eos_token_id: int,
                 pad_token_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, attention_mask, labels), each as wide as `tokens`: inputs = prefix + EOS, labels = rest + EOS."""
    rows, n = np.arange(len(tokens)), tokens.shape[1]
    pos = np.arange(n)[None, :]
    input_ids = np.where(pos < split, tokens, pad_token_id).astype(np.int64)
    input_ids[rows, split[:, 0]] = eos_token_id
    # Flat indices: a third of take_along_axis's time at these sizes.
    rest = tokens.reshape(-1)[np.minimum(pos + split, n - 1) + n * rows[:, None]]
    labels = np.where(pos < n - split, rest, -100).astype(np.int64)
    labels[rows, n - split[:, 0]] = eos_token_id
    return input_ids, (pos <= split).astype(np.int64), labels


class DataCollatorForT5MLM:
    """Turns packed chunks of `raw_length` tokens into T5 span-corruption batches."""

    def __init__(self, tokenizer, *, input_length: int, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0, seed: int = 0, num_sentinels: int | None = None):
        self.input_length = input_length
        self.noise_density = noise_density
        self.mean_noise_span_length = mean_noise_span_length
        self.raw_length, self.target_length = compute_input_and_target_lengths(
            input_length, noise_density, mean_noise_span_length)
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id
        self.decoder_start_token_id = tokenizer.pad_token_id  # T5 starts decoding from <pad>
        self.sentinel_ids = sentinel_ids(tokenizer, num_sentinels)
        self.num_spans = span_counts(self.raw_length, noise_density, mean_noise_span_length)[2]
        if len(self.sentinel_ids) < self.num_spans:
            raise ValueError(f"chunks of {self.raw_length} tokens get {self.num_spans} noise spans, but only "
                             f"{len(self.sentinel_ids)} sentinels (<extra_id_0>..<extra_id_"
                             f"{len(self.sentinel_ids) - 1}>) are available")
        # What the mask gives a chunk: (input_length, target_length) but for two cases. After T5's
        # density-0.5 hack it is shorter, and the batch pads. Where T5's helper (Python floats) and its
        # mask (float32) round apart (172-token inputs at 0.15 and 3: 38 targets by the helper, 40 by
        # the mask) it is longer: T5 then trims the end, EOS included; the batch widens instead.
        self._lengths = corrupted_lengths(self.raw_length, noise_density, mean_noise_span_length)
        self._widths = max(input_length, self._lengths[0]), max(self.target_length, self._lengths[1])
        self._keys = RowRandomness(seed)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        tokens = stack_chunks(examples, self.raw_length)
        mask = random_spans_noise_mask(len(tokens), self.raw_length, self.noise_density,
                                       self.mean_noise_span_length, self._keys(examples))
        input_ids = replace_runs(tokens, mask, self._widths[0], self.pad_token_id, self.sentinel_ids,
                                 self.eos_token_id)
        # Non-noise runs become the sentinels in the targets; since masks start with non-noise,
        # the i-th such sentinel precedes the i-th noise span, matching the inputs.
        labels = replace_runs(tokens, ~mask, self._widths[1], -100, self.sentinel_ids, self.eos_token_id)
        attention_mask = torch.from_numpy(np.arange(self._widths[0]) < self._lengths[0]).long()
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": attention_mask.expand(input_ids.shape).clone(),
            "labels": torch.from_numpy(labels),
            "decoder_input_ids": torch.from_numpy(shift_right(labels, self.decoder_start_token_id)),
        }


class DataCollatorForPrefixLM:
    """T5's prefix_lm: split each packed chunk at a uniform point; inputs = prefix, labels = rest."""

    def __init__(self, tokenizer, *, raw_length: int, seed: int = 0):
        if raw_length < 2:
            raise ValueError(f"raw_length must be at least 2 to split a chunk, got {raw_length}")
        self.raw_length = raw_length
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id
        self.decoder_start_token_id = tokenizer.pad_token_id
        self._keys = RowRandomness(seed)

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        tokens = stack_chunks(examples, self.raw_length)
        split = random_prefix_split(self._keys(examples), len(tokens), self.raw_length)
        input_ids, attention_mask, labels = split_prefix(tokens, split, self.eos_token_id, self.pad_token_id)
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(labels),
            "decoder_input_ids": torch.from_numpy(shift_right(labels, self.decoder_start_token_id)),
        }
