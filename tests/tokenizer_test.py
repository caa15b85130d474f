"""Tests for t5_training.tools.tokenizer (trains one small tokenizer on 2,000 made sentences)."""

import contextlib
import io
import json
import os
import re
import tempfile
from unittest import mock

from absl.testing import absltest, parameterized
import pyarrow as pa
import pyarrow.parquet as pq
import sentencepiece as spm
from transformers import AutoTokenizer, T5TokenizerFast

from t5_training import denoisers
from t5_training import modeling
from t5_training.tools import tokenizer as tokenizer_lib
from tests import fixtures

VOCAB_SIZE = 500  # 400 sentencepiece pieces (the 3 mode tokens among them) + 100 sentinels
REAL_LINES = fixtures.sentences(4)  # lines of the training text (BBC News sentences, made_data.py)


def _slice(n=2000):
    return [line + "\n" for line in fixtures.sentences(n)]


class TokenizerTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory()
        cls.out_dir = os.path.join(cls._tmp.name, "tok")
        cls.lines = _slice()
        cls.tok = tokenizer_lib.train_tokenizer(cls.lines, cls.out_dir, VOCAB_SIZE)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
        super().tearDownClass()

    def test_size_and_special_ids(self):
        self.assertLen(self.tok, VOCAB_SIZE)
        self.assertEqual((self.tok.pad_token_id, self.tok.eos_token_id, self.tok.unk_token_id), (0, 1, 2))
        self.assertEqual(self.tok.convert_ids_to_tokens([0, 1, 2]), ["<pad>", "</s>", "<unk>"])
        self.assertIsNone(self.tok.bos_token_id)
        self.assertTrue(self.tok.is_fast)

    @parameterized.parameters(0, 1, 42, 99)
    def test_sentinel_ids_descend_from_top(self, i):
        self.assertEqual(self.tok.convert_tokens_to_ids(f"<extra_id_{i}>"), VOCAB_SIZE - 1 - i)
        self.assertEqual(self.tok.convert_ids_to_tokens(VOCAB_SIZE - 1 - i), f"<extra_id_{i}>")

    def test_mode_tokens_follow_the_specials_as_special_tokens(self):
        self.assertEqual(self.tok.convert_tokens_to_ids(list(denoisers.MODE_TOKENS)), [3, 4, 5])
        self.assertContainsSubset(denoisers.MODE_TOKENS, self.tok.all_special_tokens)
        self.assertContainsSubset({d.mode_token for d in denoisers.UL2_DENOISERS}, denoisers.MODE_TOKENS)
        # One token wherever it stands, with or without a space after it, and dropped when decoding.
        line = REAL_LINES[1]
        for text in (f"[NLU] {line}", f"[NLU]{line}"):
            self.assertEqual(self.tok(text).input_ids, [3] + self.tok(line).input_ids)
        self.assertEqual(self.tok.decode(self.tok(f"[S2S] {line}").input_ids, skip_special_tokens=True), line)
        # In spiece.model they are control symbols: ids only, never a piece of text.
        sp = spm.SentencePieceProcessor(model_file=os.path.join(self.out_dir, "spiece.model"))
        self.assertEqual([sp.id_to_piece(i) for i in (3, 4, 5)], list(denoisers.MODE_TOKENS))
        self.assertTrue(all(sp.is_control(i) for i in (3, 4, 5)))
        self.assertNotIn(3, sp.encode(f"[NLU] {line}"))
        # So UL2's collator takes the tokenizer as it is.
        collate = denoisers.DataCollatorForDenoiserMixture(self.tok, input_length=64, denoisers=denoisers.UL2_DENOISERS,
                                                           rates=denoisers.UL2_RATES)
        self.assertEqual(sorted(set(collate.mode_ids.tolist())), [3, 4, 5])

    def test_pieces_match_sentencepiece_model(self):
        sp = spm.SentencePieceProcessor(model_file=os.path.join(self.out_dir, "spiece.model"))
        self.assertEqual(sp.get_piece_size(), VOCAB_SIZE - modeling.NUM_SENTINELS)
        for line in REAL_LINES:
            self.assertEqual(self.tok(line, add_special_tokens=False).input_ids, sp.encode(line))

    @parameterized.parameters(*REAL_LINES)
    def test_encode_real_line(self, line):
        ids = self.tok(line).input_ids
        self.assertEqual(ids[-1], 1)
        self.assertNotIn(2, ids)  # not <unk>: the trap is a tokenizer mapping everything to unk
        self.assertGreater(len(set(ids)), 2)
        self.assertEqual(self.tok.decode(ids, skip_special_tokens=True), line)

    def test_sentinel_encodes_as_single_token(self):
        ids = self.tok("<extra_id_0> speak").input_ids
        self.assertEqual(ids[0], VOCAB_SIZE - 1)
        self.assertEqual(ids[-1], 1)

    def test_unk_for_unseen_chars_only(self):
        ids = self.tok("speak \u4e2d", add_special_tokens=False).input_ids
        self.assertEqual(ids.count(2), 1)

    def test_reload_identical(self):
        reloaded = AutoTokenizer.from_pretrained(self.out_dir)
        self.assertIsInstance(reloaded, T5TokenizerFast)
        self.assertTrue(reloaded.is_fast)
        self.assertEqual(reloaded.get_vocab(), self.tok.get_vocab())
        for line in REAL_LINES:
            self.assertEqual(reloaded(line).input_ids, self.tok(line).input_ids)
        self.assertTrue(os.path.isfile(os.path.join(self.out_dir, "tokenizer.json")))

    def test_deterministic(self):
        with tempfile.TemporaryDirectory() as d:
            again = tokenizer_lib.train_tokenizer(self.lines, d, VOCAB_SIZE)
            with open(os.path.join(d, "spiece.model"), "rb") as a, \
                    open(os.path.join(self.out_dir, "spiece.model"), "rb") as b:
                self.assertEqual(a.read(), b.read())
        self.assertEqual(again.get_vocab(), self.tok.get_vocab())

    def test_has_sentinels(self):
        self.assertTrue(modeling.has_sentinels(self.tok))
        vocab = [(self.tok.convert_ids_to_tokens(i), -float(i)) for i in range(VOCAB_SIZE - 100)]
        self.assertFalse(modeling.has_sentinels(T5TokenizerFast(vocab=vocab, extra_ids=0)))
        self.assertFalse(modeling.has_sentinels(T5TokenizerFast(vocab=vocab, extra_ids=10)))
        self.assertFalse(modeling.has_sentinels(T5TokenizerFast(vocab=vocab, extra_ids=99)))  # all but the last

    @parameterized.parameters([[]], [["", "  ", "\n"]])
    def test_empty_input_raises(self, texts):
        with tempfile.TemporaryDirectory() as d, self.assertRaisesRegex(ValueError, "no text"):
            tokenizer_lib.train_tokenizer(texts, d, VOCAB_SIZE)

    def test_vocab_too_small_raises(self):
        with tempfile.TemporaryDirectory() as d, self.assertRaisesRegex(ValueError, "must exceed 106 .*3 mode tokens"):
            tokenizer_lib.train_tokenizer(self.lines, d, 106)

    def test_vocab_too_large_raises(self):
        with tempfile.TemporaryDirectory() as d, self.assertRaisesRegex(ValueError, "too large"):
            tokenizer_lib.train_tokenizer(["to be or not to be"] * 5, d, VOCAB_SIZE)

    def test_cli_glob_matches_nothing(self):
        stderr = io.StringIO()
        with self.assertRaises(SystemExit) as cm, contextlib.redirect_stderr(stderr):
            tokenizer_lib.main(["--train_file", os.path.join(self._tmp.name, "nope", "*.txt"),
                                "--output_dir", os.path.join(self._tmp.name, "unused")])
        self.assertEqual(cm.exception.code, 2)
        self.assertIn("matches no file; check the path or quote the glob", stderr.getvalue())
        self.assertFalse(os.path.exists(os.path.join(self._tmp.name, "unused")))

    def test_cli_refuses_non_empty_output_dir(self):
        stderr = io.StringIO()
        with self.assertRaises(SystemExit) as cm, contextlib.redirect_stderr(stderr):
            tokenizer_lib.main(["--train_file", fixtures.corpus_files()[0], "--output_dir", self.out_dir])
        self.assertEqual(cm.exception.code, 2)
        self.assertIn("--overwrite_output_dir", stderr.getvalue())

    def test_cli_trains_from_glob_txt_and_jsonl(self):
        with tempfile.TemporaryDirectory() as d:
            corpus = os.path.join(d, "corpus")
            os.makedirs(corpus)
            lines = self.lines
            with open(os.path.join(corpus, "a.txt"), "w", encoding="utf-8") as f:
                f.writelines(lines[:1000])
            with open(os.path.join(corpus, "b.jsonl"), "w", encoding="utf-8") as f:
                for line in lines[1000:]:
                    f.write(json.dumps({"body": line}) + "\n")
            out = os.path.join(d, "out")
            stdout = io.StringIO()
            with contextlib.redirect_stdout(stdout):
                tokenizer_lib.main(["--train_file", os.path.join(corpus, "*.txt"),
                                    "--train_file", os.path.join(corpus, "*.jsonl"), "--text_column", "body",
                                    "--output_dir", out, "--vocab_size", "450"])
            self.assertIn("450", stdout.getvalue())
            self.assertIn("[NLU], [NLG], [S2S]", stdout.getvalue())
            self.assertIn(out, stdout.getvalue())
            tok = AutoTokenizer.from_pretrained(out)
            self.assertLen(tok, 450)
            self.assertEqual(tok.convert_tokens_to_ids(["<extra_id_0>", "[NLU]"]), [449, 3])
            self.assertNotIn(2, tok(REAL_LINES[1]).input_ids)
            # A missing jsonl field: one line naming the file, the line and the flag.
            code, said = self._cli_error(["--train_file", os.path.join(corpus, "b.jsonl"),
                                          "--output_dir", os.path.join(d, "out2")])
            self.assertEqual(code, 2)
            self.assertRegex(said, r"b\.jsonl line 1 has no field 'text'; set --text_column")

    def test_cli_reads_each_kind_of_file_as_pretraining_does(self):
        # The same lines as text, as JSON lines (.jsonl and .json alike: no key or brace is learned as
        # text) and as parquet rows give the same tokenizer.
        with tempfile.TemporaryDirectory() as d:
            lines = [line.strip() for line in self.lines]
            with open(os.path.join(d, "a.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            for name in ("a.jsonl", "a.json"):
                with open(os.path.join(d, name), "w", encoding="utf-8") as f:
                    f.writelines(json.dumps({"text": line, "meta_source": "x"}) + "\n" for line in lines)
            pq.write_table(pa.table({"text": lines}), os.path.join(d, "a.parquet"))
            vocabularies = []
            for name in ("a.txt", "a.jsonl", "a.json", "a.parquet"):
                out = os.path.join(d, name + "-tok")
                with contextlib.redirect_stdout(io.StringIO()):
                    tokenizer_lib.main(["--train_file", os.path.join(d, name), "--output_dir", out,
                                        "--vocab_size", str(VOCAB_SIZE)])
                vocabularies.append(AutoTokenizer.from_pretrained(out).get_vocab())
        self.assertEqual(vocabularies[1:], vocabularies[:1] * 3)
        self.assertNotIn("\u2581meta", vocabularies[2])

    def test_cli_bad_files_and_flags_are_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            latin = os.path.join(d, "latin.txt")
            with open(latin, "wb") as f:
                f.write("caf\xe9\n".encode("latin-1"))
            a_file = os.path.join(d, "taken")
            open(a_file, "w").close()
            corpus = fixtures.corpus_files()[0]
            for argv, said in (
                    (["--train_file", latin], f"{latin} line 1 is not UTF-8 text (byte 0xe9)"),
                    (["--train_file", d], f"--train_file {d!r} is a folder; pass the files in it"),
                    (["--train_file", corpus, "--input_sentence_size", "-3"],
                     "--input_sentence_size must be at least 1, got -3")):
                code, line = self._cli_error([*argv, "--output_dir", os.path.join(d, "out")])
                self.assertEqual(code, 2)
                self.assertIn(said, line)
                self.assertFalse(os.path.exists(os.path.join(d, "out")))
            code, line = self._cli_error(["--train_file", corpus, "--output_dir", a_file])
            self.assertEqual((code, line), (2, f"python -m t5_training.tokenizer: error: --output_dir {a_file} is a "
                                               "file; pick a folder"))

    def test_cli_a_full_disk_leaves_nothing_half_written(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "tok")
            real = T5TokenizerFast.save_pretrained

            def full(tokenizer, folder, *args, **kwargs):  # part of the files written, then no space
                real(tokenizer, folder, *args, **kwargs)
                raise Exception("failed to write tokenizer.json (os error 28)")

            with mock.patch.object(T5TokenizerFast, "save_pretrained", full):
                code, line = self._cli_error(["--train_file", fixtures.corpus_files()[0], "--output_dir", out,
                                              "--vocab_size", str(VOCAB_SIZE)])
            self.assertEqual(code, 2)
            self.assertRegex(line, rf"could not write {re.escape(out)} \(No space left on device; [\d.]+ MiB free in "
                                   rf"{re.escape(d)}\); nothing half-written was left: free space and rerun$")
            self.assertEqual(os.listdir(d), [])

    def test_cli_ctrl_c_is_one_line(self):
        with tempfile.TemporaryDirectory() as d, \
                mock.patch.object(tokenizer_lib, "train_tokenizer", side_effect=KeyboardInterrupt):
            code, line = self._cli_error(["--train_file", fixtures.corpus_files()[0], "--output_dir", d])
        self.assertEqual((code, line), (130, "python -m t5_training.tokenizer: interrupted (Ctrl-C); nothing was "
                                             "written"))

    def _cli_error(self, argv):
        """The exit code and the one line on stderr of a refused command."""
        stderr = io.StringIO()
        with self.assertRaises(SystemExit) as cm, contextlib.redirect_stderr(stderr):
            tokenizer_lib.main(argv)
        lines = stderr.getvalue().strip().splitlines()
        self.assertLen(lines, 1, stderr.getvalue())
        return cm.exception.code, lines[0]

    def test_cli_vocab_below_the_reserved_ids_is_one_line(self):
        out = os.path.join(self._tmp.name, "small")
        code, said = self._cli_error(["--train_file", fixtures.corpus_files()[0], "--output_dir", out,
                                      "--vocab_size", "100"])
        self.assertEqual(code, 2)
        self.assertIn("vocab_size=100 must exceed 106", said)
        self.assertFalse(os.path.exists(out))

    def test_cli_vocab_above_what_the_corpus_gives_names_the_largest_that_trains(self):
        corpus = os.path.join(self._tmp.name, "short.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("to be or not to be, that is the question\n" * 5)
        out = os.path.join(self._tmp.name, "large")
        code, said = self._cli_error(["--train_file", corpus, "--output_dir", out, "--vocab_size", "60000"])
        self.assertEqual(code, 2)
        self.assertFalse(os.path.exists(out))
        most = int(re.search(r"at most (\d+) \(sentinels included\)", said).group(1))
        # The advice counts the sentinels as --vocab_size does: that size trains, one more does not.
        with contextlib.redirect_stdout(io.StringIO()):
            tokenizer_lib.main(["--train_file", corpus, "--output_dir", out, "--vocab_size", str(most)])
        self.assertLen(AutoTokenizer.from_pretrained(out), most)
        code, _ = self._cli_error(["--train_file", corpus, "--output_dir", out + "2", "--vocab_size", str(most + 1)])
        self.assertEqual(code, 2)


if __name__ == "__main__":
    absltest.main()
