"""Span-corruption collator speed: DataCollatorForT5MLM (vectorised over the batch) against a per-example version,
and UL2's mixture of denoisers against DataCollatorForT5MLM.

    python benchmarks/collator_speed.py            # batches of 8 and 64, ~30 s on one CPU core
    python benchmarks/collator_speed.py --quick    # fewer batches: checks that it runs, not its speed

Both sides turn packed chunks of 568 raw tokens (512-token inputs at noise density 0.15, mean span
length 3) into the same batch: input_ids (512), attention_mask, labels (114) and
decoder_input_ids, as torch tensors. The reference below is the straightforward way to write
T5's span corruption (t5/data/preprocessors.py): for each example, random_spans_noise_mask with
_random_segmentation (numpy, one permutation per segmentation), then
noise_span_to_unique_sentinel for the inputs and nonnoise_span_to_unique_sentinel for the
targets, EOS appended, and the rows stacked. The reference draws from a generator seeded by the
batch's `idx` values; the project's collator draws each row from its own key (seed, its `idx`),
counter-based and vectorised over the rows. Their draws differ, so
the benchmark checks each side on its own: shapes and dtypes equal, 85 noise tokens in 28 spans
per row, the right sentinels in order, decoder inputs shifted right, and every original chunk
rebuilt exactly from its inputs and targets.

UL2's mixture (denoisers.parse_mixture("ul2"), seven denoisers at equal rates) turns chunks of 1004
raw tokens into 512-token inputs (mode token included) at batch 64; the goal is that it takes at
most 1.5x the time of DataCollatorForT5MLM at the same batch size and input length. Its batches are
checked too: mode token first, shapes, and every row's chunk rebuilt from its inputs and targets.
The two sides alternate over 4x as many rounds of a quarter of the batches; the ratio is the
median of the paired rounds' ratios (best round against best round is printed beside it).
UL2's X(mean 3, density 0.5) puts 127 spans in a 512-token input, more than T5's 100 sentinels,
so this side's vocabulary has 150.

Timing: rounds alternate between the two sides; each round collates --batches batches (token ids
as numpy int32 rows, as pack_dataset gives them). Examples/s is from the best round of each
side (the one least disturbed by other work on the machine); the median is reported too.
Prints a table and writes --output (JSON).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import REPO  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from t5_training.collators import DataCollatorForT5MLM  # noqa: E402
from t5_training.denoisers import DataCollatorForDenoiserMixture, parse_mixture  # noqa: E402
from t5_training import reporting  # noqa: E402

GOAL = 5.0
MIXTURE_GOAL, MIXTURE_BATCH = 1.5, 64  # UL2's mixture: at most 1.5x the span-corruption collator's time
NOISE_DENSITY, MEAN_SPAN = 0.15, 3.0
EOS, PAD = 1, 0


class SentinelVocabulary:
    """What the collator reads from a tokenizer, laid out as T5's: <extra_id_0> is 32099, counting down."""

    eos_token_id, pad_token_id = EOS, PAD

    def get_vocab(self) -> dict:
        return {f"<extra_id_{i}>": 32099 - i for i in range(100)}


class ModeVocabulary(SentinelVocabulary):
    """Like SentinelVocabulary, with 150 sentinels and UL2's three mode tokens above them."""

    def get_vocab(self) -> dict:
        vocab = {f"<extra_id_{i}>": 32249 - i for i in range(150)}
        return {**vocab, "[NLU]": 32250, "[NLG]": 32251, "[S2S]": 32252}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and rounds: checks that it runs")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--input_length", type=int, default=512)
    parser.add_argument("--batches", type=int, default=None,
                        help="batches per round (default: 4096 examples' worth; quick: 256)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per side (default 5; quick: 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="results JSON (default: runs/collator_speed[_quick].json)")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    name = "collator_speed_quick.json" if args.quick else "collator_speed.json"
    args.output = args.output or os.path.join(REPO, "runs", name)
    return args


# --- the per-example reference -----------------------------------------------------------------

def reference_noise_mask(length: int, rng: np.random.Generator) -> np.ndarray:
    """T5's random_spans_noise_mask for one example (no random_roll)."""
    num_noise = min(max(int(round(length * NOISE_DENSITY)), 1), length - 1)
    num_spans = max(int(round(num_noise / MEAN_SPAN)), 1)
    num_nonnoise = length - num_noise

    def random_segmentation(num_items: int, num_segments: int) -> np.ndarray:
        first_in_segment = np.pad(rng.permutation(np.arange(num_items - 1) < num_segments - 1), [1, 0])
        return np.bincount(np.cumsum(first_in_segment), minlength=num_segments)

    interleaved = np.stack([random_segmentation(num_nonnoise, num_spans),
                            random_segmentation(num_noise, num_spans)], axis=1).reshape(-1)
    span_start = np.zeros(length, dtype=bool)
    span_start[np.cumsum(interleaved)[:-1]] = True
    return np.cumsum(span_start) % 2 == 1


def reference_span_to_sentinel(tokens: np.ndarray, noise: np.ndarray, sentinel_ids: np.ndarray) -> np.ndarray:
    """T5's noise_span_to_unique_sentinel: each noise span becomes its sentinel; EOS appended."""
    previous = np.pad(noise[:-1], [1, 0])
    first = noise & ~previous
    sentinels = sentinel_ids[np.cumsum(first) - 1]
    return np.append(np.where(first, sentinels, tokens)[~(noise & previous)], EOS)


class ReferenceCollator:
    """Span corruption one example at a time: the same algorithm and output as DataCollatorForT5MLM."""

    def __init__(self, input_length: int, target_length: int, sentinel_ids: np.ndarray, seed: int):
        self.input_length, self.target_length = input_length, target_length
        self.sentinel_ids, self.seed = sentinel_ids, seed

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, *(int(ex["idx"]) for ex in examples)]))
        inputs, labels = [], []
        for example in examples:
            tokens = np.asarray(example["input_ids"], dtype=np.int64)
            noise = reference_noise_mask(len(tokens), rng)
            row = reference_span_to_sentinel(tokens, noise, self.sentinel_ids)
            inputs.append(np.pad(row, [0, self.input_length - len(row)], constant_values=PAD))
            row = reference_span_to_sentinel(tokens, ~noise, self.sentinel_ids)
            labels.append(np.pad(row, [0, self.target_length - len(row)], constant_values=-100))
        input_ids, labels = np.stack(inputs), np.stack(labels)
        decoder_input_ids = np.concatenate([np.full((len(labels), 1), PAD), labels[:, :-1]], axis=1)
        return {"input_ids": torch.from_numpy(input_ids),
                "attention_mask": torch.from_numpy((input_ids != PAD).astype(np.int64)),
                "labels": torch.from_numpy(labels),
                "decoder_input_ids": torch.from_numpy(np.where(decoder_input_ids == -100, PAD, decoder_input_ids))}


# --- checks ------------------------------------------------------------------------------------

def rebuild(inputs: list[int], labels: list[int], sentinel_ids: np.ndarray) -> list[int]:
    """The original chunk: each sentinel of the inputs replaced by what follows it in the targets."""
    sentinels = set(sentinel_ids.tolist())
    spans, current = {}, None
    for token in labels[:labels.index(EOS)]:
        if token in sentinels:
            current = spans.setdefault(token, [])
        else:
            current.append(token)
    out = []
    for token in inputs[:inputs.index(EOS)]:
        out.extend(spans[token] if token in sentinels else [token])
    return out


def check_batch(batch: dict, examples: list[dict], sentinel_ids: np.ndarray, lengths: tuple[int, int],
                spans: int, noise: int) -> None:
    """Raises AssertionError unless `batch` is a valid span corruption of `examples`."""
    size, (source, target) = len(examples), lengths
    expected = {"input_ids": (size, source), "attention_mask": (size, source), "labels": (size, target),
                "decoder_input_ids": (size, target)}
    assert {k: tuple(v.shape) for k, v in batch.items()} == expected, {k: v.shape for k, v in batch.items()}
    assert all(v.dtype == torch.int64 for v in batch.values())
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1].clamp(min=PAD))
    assert bool((batch["decoder_input_ids"][:, 0] == PAD).all())
    is_sentinel = np.isin(batch["input_ids"].numpy(), sentinel_ids)
    for row, example in enumerate(examples):
        inputs, labels = batch["input_ids"][row].tolist(), batch["labels"][row].tolist()
        used = [t for t in inputs if t in sentinel_ids]
        assert used == sentinel_ids[:spans].tolist(), f"row {row}: sentinels {used[:5]}..."
        assert [t for t in labels if t in sentinel_ids] == used
        assert len(labels) - labels.count(-100) - spans - 1 == noise, f"row {row}: noise tokens"
        assert rebuild(inputs, labels, sentinel_ids) == np.asarray(example["input_ids"]).tolist(), f"row {row}"
        assert int(batch["attention_mask"][row].sum()) == inputs.index(EOS) + 1
    assert int(is_sentinel.sum()) == size * spans


def check_mixture_batch(batch: dict, examples: list[dict], collate: DataCollatorForDenoiserMixture) -> None:
    """Raises AssertionError unless every row is its denoiser's corruption of its chunk, mode token first."""
    ids, used = batch["denoiser_ids"].tolist(), batch["num_raw_tokens"].tolist()
    width = max(collate.target_lengths[i] for i in ids)
    assert tuple(batch["input_ids"].shape) == (len(examples), collate.input_length)
    assert tuple(batch["labels"].shape) == tuple(batch["decoder_input_ids"].shape) == (len(examples), width)
    for row, example in enumerate(examples):
        denoiser, chunk = collate.denoisers[ids[row]], np.asarray(example["input_ids"])[:used[row]].tolist()
        inputs, labels = batch["input_ids"][row].tolist(), batch["labels"][row].tolist()
        assert inputs[0] == collate.mode_ids[ids[row]], f"row {row}: mode token"
        if denoiser.kind == "span":
            assert rebuild(inputs[1:], labels, collate.sentinel_ids) == chunk, f"row {row}"
        else:
            assert inputs[1:inputs.index(EOS)] + labels[:labels.index(EOS)] == chunk, f"row {row}"


# --- timing ------------------------------------------------------------------------------------

def make_batches(count: int, batch_size: int, raw_length: int, seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, 32000, size=(count * batch_size, raw_length), dtype=np.int32)  # ordinary pieces only
    rows = [{"input_ids": ids[i], "idx": i} for i in range(len(ids))]
    return [rows[i:i + batch_size] for i in range(0, len(rows), batch_size)]


def time_round(collate, batches: list[list[dict]]) -> float:
    start = time.perf_counter()
    for examples in batches:
        collate(examples)
    return time.perf_counter() - start


def time_sides(sides: dict, batches: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds per round for each side, the sides alternating round by round."""
    for name, collate in sides.items():
        collate(batches[name][0])  # warm up
    seconds = {name: [] for name in sides}
    for _ in range(rounds):
        for name, collate in sides.items():
            seconds[name].append(time_round(collate, batches[name]))
    return seconds


def time_mixture(args: argparse.Namespace) -> dict:
    """UL2's mixture against the plain span-corruption collator, both at batch 64 and --input_length."""
    denoisers, rates = parse_mixture("ul2")
    sides = {"ul2 mixture": DataCollatorForDenoiserMixture(ModeVocabulary(), input_length=args.input_length,
                                                           denoisers=denoisers, rates=rates, seed=args.seed),
             "span corruption": DataCollatorForT5MLM(SentinelVocabulary(), input_length=args.input_length,
                                                     seed=args.seed)}
    examples = make_batches(1, MIXTURE_BATCH, sides["ul2 mixture"].raw_length, args.seed + 1)[0]
    check_mixture_batch(sides["ul2 mixture"](examples), examples, sides["ul2 mixture"])
    # Many short rounds, paired: on a shared 2-core VM one side's best round can land in a quiet
    # second and the other's not, so the median of the per-pair ratios is the steadier figure.
    count = max(1, (args.batches or (256 if args.quick else 4096) // MIXTURE_BATCH) // 4)
    batches = {name: make_batches(count, MIXTURE_BATCH, collate.raw_length, args.seed)
               for name, collate in sides.items()}
    seconds = time_sides(sides, batches, args.rounds * 4)
    entry = {"batch_size": MIXTURE_BATCH, "batches_per_round": count, "round_seconds": seconds,
             "raw_lengths": {name: collate.raw_length for name, collate in sides.items()},
             "check": "ok: mode token first, shapes, every chunk rebuilt from inputs + targets",
             "goal_ratio": MIXTURE_GOAL}
    for name in sides:
        entry[f"{name} examples_per_second"] = count * MIXTURE_BATCH / min(seconds[name])
    entry["ratio"] = statistics.median(m / s for m, s in zip(seconds["ul2 mixture"], seconds["span corruption"]))
    entry["ratio_best_rounds"] = min(seconds["ul2 mixture"]) / min(seconds["span corruption"])
    return entry


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)  # collators run in data-loader workers; torch is only the final wrapper here
    vectorised = DataCollatorForT5MLM(SentinelVocabulary(), input_length=args.input_length,
                                      noise_density=NOISE_DENSITY, mean_noise_span_length=MEAN_SPAN, seed=args.seed)
    raw, lengths = vectorised.raw_length, (args.input_length, vectorised.target_length)
    reference = ReferenceCollator(*lengths, vectorised.sentinel_ids, args.seed)
    sides = {"vectorised": vectorised, "per-example": reference}
    noise = vectorised.target_length - vectorised.num_spans - 1  # targets: spans, sentinels, EOS
    print(f"{raw} raw tokens -> {lengths[0]} inputs, {lengths[1]} targets; {noise} noise tokens in "
          f"{vectorised.num_spans} spans", flush=True)

    checks = {}
    for name, collate in sides.items():
        for batch_size in args.batch_sizes:
            examples = make_batches(1, batch_size, raw, args.seed + batch_size)[0]
            check_batch(collate(examples), examples, vectorised.sentinel_ids, lengths, vectorised.num_spans, noise)
        checks[name] = "ok: shapes, sentinels, shifted decoder inputs, every chunk rebuilt from inputs + targets"

    rows, per_batch = [], []
    for batch_size in args.batch_sizes:
        count = args.batches or max(1, (256 if args.quick else 4096) // batch_size)
        batches = make_batches(count, batch_size, raw, args.seed)
        seconds = time_sides(sides, dict.fromkeys(sides, batches), args.rounds)
        examples = count * batch_size
        entry = {"batch_size": batch_size, "batches_per_round": count, "round_seconds": seconds}
        for name in sides:
            entry[f"{name}_examples_per_second"] = examples / min(seconds[name])
            entry[f"{name}_examples_per_second_median"] = examples / statistics.median(seconds[name])
        entry["speedup"] = min(seconds["per-example"]) / min(seconds["vectorised"])
        entry["speedup_median"] = statistics.median(seconds["per-example"]) / statistics.median(seconds["vectorised"])
        per_batch.append(entry)
        rows.append({"batch": batch_size, "vectorised ex/s": round(entry["vectorised_examples_per_second"]),
                     "per-example ex/s": round(entry["per-example_examples_per_second"]),
                     "speedup": f"{entry['speedup']:.1f}x", "speedup (medians)": f"{entry['speedup_median']:.1f}x"})

    mixture = time_mixture(args)

    print()
    print(reporting.format_table(rows))
    print(f"\ngoal: vectorised >= {GOAL:g}x per-example; checks: {checks['vectorised']} (both sides)")
    print(f"\nbatch {MIXTURE_BATCH}, {args.input_length}-token inputs: UL2 mixture "
          f"{mixture['ul2 mixture examples_per_second']:.0f} ex/s, span corruption "
          f"{mixture['span corruption examples_per_second']:.0f} ex/s: {mixture['ratio']:.2f}x the time "
          f"(median of {len(mixture['round_seconds']['ul2 mixture'])} paired rounds; {mixture['ratio_best_rounds']:.2f}x "
          f"best round against best round); goal <= {MIXTURE_GOAL:g}x; mixture check: {mixture['check']}")
    results = {"quick": args.quick, "raw_length": raw, "input_length": lengths[0], "target_length": lengths[1],
               "noise_density": NOISE_DENSITY, "mean_noise_span_length": MEAN_SPAN, "rounds": args.rounds,
               "checks": checks, "batch_sizes": per_batch, "goal_speedup": GOAL, "ul2_mixture": mixture}
    reporting.write_json(args.output, results)
    print(f"wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
