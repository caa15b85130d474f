"""Train a T5-style SentencePiece tokenizer for from-scratch models.

    python -m t5_training.tokenizer --train_file 'corpus/*.txt' [--train_file more.jsonl] \
        --output_dir runs/tok --vocab_size 8000

It reads the files as pre_train_t5.py does (t5_training/text_files.py), and writes the folder whole
or not at all.

Layout matches the original T5 vocabulary: pad=0 "<pad>", eos=1 "</s>", unk=2 "<unk>", no bos,
then UL2's three mode tokens "[NLU]", "[NLG]", "[S2S]" (ids 3, 4, 5: sentencepiece control
symbols, special tokens of the fast tokenizer), then the unigram pieces, then 100 sentinels with
"<extra_id_0>" at the HIGHEST id (len - 1) down to "<extra_id_99>" (len - 100). So every
tokenizer serves both span corruption and UL2's mixture of denoisers (pre_train_t5.py
--objective ul2). `vocab_size` counts the sentinels and mode tokens too, so the model's
embedding size is exactly `vocab_size`. The output dir loads with `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import re
import shutil
import tempfile
from typing import Iterable, Iterator

import sentencepiece as spm
from transformers import AutoTokenizer, PreTrainedTokenizerBase, T5TokenizerFast

from t5_training import text_files
from t5_training.checkpoint import attempt_write, could_not_write
from t5_training.export import partial_folder, write_folder_whole
from t5_training.denoisers import MODE_TOKENS
from t5_training.errors import EXIT_INTERRUPTED, UsageError, WriteError
from t5_training.modeling import NUM_SENTINELS


def _lines(texts: Iterable[str]) -> Iterator[str]:
    # Split multi-line documents (e.g. jsonl paragraphs) so no "sentence" exceeds sentencepiece's
    # length cap and gets dropped silently; blank lines carry no signal.
    for text in texts:
        for line in text.splitlines():
            if line := line.strip():
                yield line


def train_tokenizer(texts: Iterable[str], output_dir: str, vocab_size: int = 8000, *,
                    input_sentence_size: int = 1_000_000, seed: int = 0) -> PreTrainedTokenizerBase:
    """Trains a unigram model of `vocab_size - 100` pieces (UL2's mode tokens among them), adds 100
    sentinels, saves and reloads it.

    `vocab_size` is the TOTAL size including the 100 sentinels. Returns the reloaded fast tokenizer.
    """
    reserved = NUM_SENTINELS + 3 + len(MODE_TOKENS)
    if vocab_size <= reserved:
        raise ValueError(f"vocab_size={vocab_size} must exceed {reserved} (100 sentinels, 3 specials and "
                         f"{len(MODE_TOKENS)} mode tokens)")
    lines = _lines(texts)
    first = next(lines, None)
    if first is None:
        raise ValueError("train_tokenizer got no text (every input line was empty); pass a non-empty corpus")
    errors: list[BaseException] = []

    def sentences() -> Iterator[str]:
        # sentencepiece wraps exceptions from the iterator in an opaque RuntimeError; keep the original.
        try:
            yield from itertools.chain([first], lines)
        except Exception as e:
            errors.append(e)
            raise

    spm.set_random_generator_seed(seed)  # drives input sampling/shuffling -> deterministic output
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_writer=model, model_type="unigram",
            vocab_size=vocab_size - NUM_SENTINELS, input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True, max_sentence_length=1 << 15,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
            # Control symbols take the ids right after the specials and are never pieces of text in
            # sentencepiece; the fast tokenizer makes them special tokens, which match as one token.
            control_symbols=list(MODE_TOKENS),
            # Fixed thread count: the EM sums are sharded per thread, so it must not vary by machine.
            num_threads=16, minloglevel=2)
    except RuntimeError as e:
        if errors:
            raise errors[0] from None
        raise _training_error(e, vocab_size) from None
    with tempfile.TemporaryDirectory() as tmp:
        # T5TokenizerFast(vocab_file=...) silently ignores the file in transformers 5, and from_pretrained on
        # output_dir could pick up a stale tokenizer.json; converting from a dir holding only spiece.model
        # runs the library's own slow->fast conversion (precompiled normalizer, sentinels at the top ids).
        with open(os.path.join(tmp, "spiece.model"), "wb") as f:
            f.write(model.getvalue())
        tokenizer = T5TokenizerFast.from_pretrained(tmp, extra_ids=NUM_SENTINELS)
    _save_whole(tokenizer, model.getvalue(), output_dir)
    return AutoTokenizer.from_pretrained(output_dir)


def _save_whole(tokenizer, spiece_model: bytes, output_dir: str) -> None:
    """Writes the tokenizer under `<output_dir>.tmp` and renames it into place once complete, so a
    full disk leaves no half-written tokenizer.json (a WriteError says so) and an earlier one intact."""
    def fill(folder: str) -> None:
        tokenizer.save_pretrained(folder)
        # save_pretrained in v5 writes only tokenizer.json/config; keep the raw model for sentencepiece users.
        with open(os.path.join(folder, "spiece.model"), "wb") as f:
            f.write(spiece_model)

    failure = attempt_write(lambda: write_folder_whole(output_dir, fill))
    if failure is not None:
        shutil.rmtree(partial_folder(output_dir), ignore_errors=True)
        raise WriteError(f"{could_not_write(output_dir, failure)}; nothing half-written was left: free space and "
                         "rerun")


def _training_error(error: RuntimeError, vocab_size: int) -> ValueError:
    """sentencepiece's refusal as one line; a size the corpus cannot give says the largest it can."""
    msg = str(error).strip().splitlines()[-1]
    most = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", msg)
    if most:
        # sentencepiece counts its own pieces; --vocab_size counts the 100 sentinels as well.
        return ValueError(f"vocab_size={vocab_size} is too large for this corpus: it has room for at most "
                          f"{int(most.group(1)) + NUM_SENTINELS} (sentinels included); pass a smaller "
                          f"vocab_size or more text")
    # Its advice names its own flags (--character_coverage), which this command does not have.
    msg = re.sub(r"\s*Increase vocab_size.*$", "", msg)
    return ValueError(f"sentencepiece could not train vocab_size={vocab_size} on this corpus: {msg}; "
                      "pass a larger --vocab_size or more text")


def _read_texts(paths: list[str], text_column: str) -> Iterator[str]:
    """The documents of every file, read as pretraining reads them (t5_training/text_files.py)."""
    for path in paths:
        yield from text_files.iter_documents(path, text_column)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m t5_training.tokenizer", allow_abbrev=False,
                                     description=__doc__.split("\n")[0])

    def fail(msg: str) -> None:  # one line on stderr (no usage dump), exit status 2 like argparse
        parser.exit(2, f"{parser.prog}: error: {msg}\n")

    parser.add_argument("--train_file", action="append", required=True,
                        help="Glob of .txt (one paragraph per line), .jsonl/.json (JSON lines) or .parquet files; "
                             "repeatable. Read as pre_train_t5.py reads them.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--vocab_size", type=int, default=8000, help="Total size INCLUDING the 100 sentinels.")
    parser.add_argument("--text_column", default="text", help="Field holding the text in .jsonl and .parquet files.")
    parser.add_argument("--input_sentence_size", type=int, default=1_000_000,
                        help="Lines sentencepiece samples to train on.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite_output_dir", action="store_true")
    args = parser.parse_args(argv)

    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        fail(f"--output_dir {args.output_dir} is a file; pick a folder")
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir) and not args.overwrite_output_dir:
        fail(f"--output_dir {args.output_dir} is not empty; pass --overwrite_output_dir or pick a new dir")
    if args.input_sentence_size < 1:
        fail(f"--input_sentence_size must be at least 1, got {args.input_sentence_size}")
    try:
        paths = text_files.expand_files(args.train_file)
        tokenizer = train_tokenizer(_read_texts(paths, args.text_column), args.output_dir, args.vocab_size,
                                    input_sentence_size=args.input_sentence_size, seed=args.seed)
    except (UsageError, WriteError, ValueError) as err:  # a bad file, a full disk, a size the corpus cannot give
        fail(str(err.args[0]) if err.args else str(err))
    except KeyboardInterrupt:
        parser.exit(EXIT_INTERRUPTED, f"{parser.prog}: interrupted (Ctrl-C); nothing was written\n")
    print(f"Trained tokenizer with vocab size {len(tokenizer)} (incl. {NUM_SENTINELS} sentinels and the mode tokens "
          f"{', '.join(MODE_TOKENS)}), "
          f"saved to {args.output_dir}")


if __name__ == "__main__":
    main()
