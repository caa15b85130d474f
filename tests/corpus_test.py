"""Tests for t5_training.corpus on English documents (made_data.py) encoded with the fixture tokenizer.

The reference token stream is built here independently of the code under test: each document
(a non-blank line, stripped) is encoded without special tokens, and joined with no separator as
T5 packs (EOS is appended by hand where the option asks for it).
Packing must then be an exact cut of that stream, whichever way the corpus is read.
"""

import itertools
import os
import re
import tempfile

from absl.testing import absltest, parameterized
import datasets
import numpy as np
import torch
from transformers import AutoTokenizer

from t5_training.collators import DataCollatorForT5MLM
from tests import fixtures, made_data
from t5_training import corpus
from t5_training.errors import UsageError

EOS, PAD = 1, 0
N_DOCS = 500

datasets.disable_progress_bars()


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _keep(batch):
    """A trivial collate: the list of examples as it comes."""
    return batch


def _rows(chunks):
    """A chunk matrix (or list of chunk arrays) as hashable tuples, for multiset comparisons."""
    return [tuple(int(t) for t in chunk) for chunk in chunks]


class CorpusTest(fixtures.TempDirTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tok = AutoTokenizer.from_pretrained(fixtures.tokenizer_dir())
        cls.lines = made_data.documents(N_DOCS)
        assert len(cls.lines) == N_DOCS
        # T5 packs documents end to end: the reference stream is their ids, with no separator.
        cls.docs = cls.tok(cls.lines, add_special_tokens=False).input_ids
        cls.stream = np.concatenate([np.asarray(d, dtype=np.int64) for d in cls.docs])
        assert len(cls.stream) > 50 * 1000, len(cls.stream)
        tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(tmp.cleanup)
        cls.corpus_dir = tmp.name
        # Blank and whitespace-only lines between documents: the reader must skip them.
        cls.path = _write(os.path.join(tmp.name, "wiki.txt"), "\n".join(f"{line}\n  " for line in cls.lines) + "\n")
        # The same documents split over three files, for file-level sharding.
        cls.bounds = [0, 150, 330, N_DOCS]
        cls.parts = [_write(os.path.join(tmp.name, f"part{i}.txt"), "\n".join(cls.lines[a:b]) + "\n")
                     for i, (a, b) in enumerate(zip(cls.bounds, cls.bounds[1:]))]

    # --- references ---------------------------------------------------------------------------

    def packed(self, doc_indices, chunk_length):
        """(chunks, tail length) of the documents `doc_indices`, joined in order and cut."""
        stream = np.concatenate([np.asarray(self.docs[i], dtype=np.int64) for i in doc_indices])
        n = len(stream) // chunk_length
        return stream[: n * chunk_length].reshape(n, chunk_length), len(stream) - n * chunk_length

    def read(self, sources, chunk_length, **kw):
        """Every chunk of one pass of a PackedStream, in order: (chunk matrix, idx list)."""
        rows = list(corpus.PackedStream(sources, self.tok, chunk_length, cycle=False, **kw))
        for row in rows:
            self.assertEqual(row["input_ids"].shape, (chunk_length,))
        ids = np.stack([row["input_ids"] for row in rows]) if rows else np.zeros((0, chunk_length), np.int64)
        return ids, [row["idx"] for row in rows]

    def assertExactCut(self, chunks, doc_indices, chunk_length):
        expected, tail = self.packed(doc_indices, chunk_length)
        self.assertEqual(chunks.shape, expected.shape)
        np.testing.assert_array_equal(chunks, expected)
        self.assertLess(tail, chunk_length)

    def test_reference_stream_matches_tokenize_documents(self):
        self.assertEqual(corpus.tokenize_documents(self.lines[:20], self.tok), self.docs[:20])
        self.assertNotIn(PAD, self.stream)  # so a 0 in a chunk could only be padding
        self.assertNotIn(EOS, self.stream)  # the text holds no EOS of its own

    # --- the separator ----------------------------------------------------------------------------

    def test_both_packers_join_documents_without_eos_by_default(self):
        documents = corpus.load_documents([self.path], None, None, "train", "text", streaming=False)
        packed = np.asarray(corpus.pack_dataset(documents, self.tok, 568)["input_ids"])
        streamed, _ = self.read([self.path], 568)
        for chunks in (packed, streamed):
            self.assertExactCut(chunks, range(N_DOCS), 568)
            self.assertNotIn(EOS, chunks)

    def test_eos_between_documents_in_both_packers(self):
        # The option: each document followed by EOS, one per document, in both forms.
        with_eos = [ids + [EOS] for ids in self.docs]
        stream = np.concatenate([np.asarray(d, dtype=np.int64) for d in with_eos])
        n = len(stream) // 568
        documents = corpus.load_documents([self.path], None, None, "train", "text", streaming=False)
        packed = np.asarray(corpus.pack_dataset(documents, self.tok, 568, eos_between_documents=True)["input_ids"])
        streamed, _ = self.read([self.path], 568, eos_between_documents=True)
        for chunks in (packed, streamed):
            np.testing.assert_array_equal(chunks.reshape(-1), stream[: n * 568])
            self.assertEqual(int(np.sum(chunks == EOS)), int(np.sum(stream[: n * 568] == EOS)))
        self.assertEqual(corpus.tokenize_documents(self.lines[:3], self.tok, eos_between_documents=True),
                         with_eos[:3])

    def test_corrupted_inputs_and_targets_end_with_the_only_eos_by_default(self):
        # T5: EOS is appended after corruption, so each input and target holds exactly one, last.
        # With a separator, document EOS tokens land mid-chunk, where sentinels can mask them.
        collator = DataCollatorForT5MLM(self.tok, input_length=128, seed=0)
        documents = corpus.load_documents([self.path], None, None, "train", "text", streaming=False)
        for eos_between, expect_inner in ((False, False), (True, True)):
            packed = corpus.pack_dataset(documents, self.tok, collator.raw_length, eos_between_documents=eos_between)
            batch = collator([packed[i] for i in range(32)])
            for key in ("input_ids", "labels"):
                counts = (batch[key] == EOS).sum(1)
                self.assertEqual(bool((counts > 1).any()), expect_inner, key)
                self.assertTrue(torch.all(counts >= 1))

    # --- in memory ------------------------------------------------------------------------------

    @parameterized.parameters(141, 568, 1000)
    def test_pack_dataset_is_an_exact_cut_of_the_stream(self, chunk_length):
        documents = corpus.load_documents([self.path], None, None, "train", "text", streaming=False)
        self.assertEqual(list(documents["text"]), self.lines)
        packed = corpus.pack_dataset(documents, self.tok, chunk_length)
        n = len(self.stream) // chunk_length
        self.assertEqual(len(packed), n)
        ids = np.asarray(packed["input_ids"])
        self.assertEqual(ids.shape, (n, chunk_length))  # every row exactly chunk_length ids
        np.testing.assert_array_equal(ids.reshape(-1), self.stream[: n * chunk_length])
        self.assertLess(len(self.stream) - n * chunk_length, chunk_length)  # only a partial chunk dropped
        self.assertNotIn(PAD, ids)
        np.testing.assert_array_equal(np.asarray(packed["idx"]), np.arange(n))
        self.assertIsInstance(packed[0]["input_ids"], np.ndarray)  # numpy rows for the collator

    def test_pack_dataset_with_two_processes_keeps_order(self):
        documents = corpus.load_documents([self.path], None, None, "train", "text", streaming=False)
        packed = corpus.pack_dataset(documents, self.tok, 568, num_proc=2)
        n = len(self.stream) // 568
        np.testing.assert_array_equal(np.asarray(packed["input_ids"]).reshape(-1), self.stream[: n * 568])

    def test_pack_dataset_smaller_than_one_chunk(self):
        path = _write(os.path.join(self.dir, "small.txt"), "\n".join(self.lines[:3]) + "\n")
        documents = corpus.load_documents([path], None, None, "train", "text", streaming=False)
        tokens = sum(len(d) for d in self.docs[:3])
        with self.assertRaisesRegex(UsageError, f"has {tokens} tokens, fewer than one chunk of {tokens + 1}"):
            corpus.pack_dataset(documents, self.tok, tokens + 1)
        self.assertLen(corpus.pack_dataset(documents, self.tok, tokens), 1)  # exactly one chunk fits

    # --- streaming: one reader and strided readers -------------------------------------------

    @parameterized.parameters((141, 256), (568, 7), (1000, 1))
    def test_stream_one_reader_is_the_same_cut(self, chunk_length, tokenize_batch):
        # A small tokenize_batch carries the remainder over many batch boundaries.
        chunks, idx = self.read([self.path], chunk_length, tokenize_batch=tokenize_batch)
        self.assertExactCut(chunks, range(N_DOCS), chunk_length)
        self.assertNotIn(PAD, chunks)
        self.assertLen(set(idx), len(idx))
        self.assertTrue(all(isinstance(i, (int, np.integer)) and i >= 0 for i in idx))

    @parameterized.parameters(141, 568)
    def test_two_processes_stride_documents(self, chunk_length):
        halves = [self.read([self.path], chunk_length, rank=r, world_size=2) for r in (0, 1)]
        for rank, (chunks, _) in enumerate(halves):
            self.assertExactCut(chunks, range(rank, N_DOCS, 2), chunk_length)
        idx = halves[0][1] + halves[1][1]
        self.assertLen(set(idx), len(idx))  # unique across processes
        # Together they hold the whole corpus, less at most one partial chunk per reader.
        total = sum(len(chunks) for chunks, _ in halves) * chunk_length
        self.assertBetween(total, len(self.stream) - 2 * chunk_length + 2, len(self.stream))

    def test_several_files_one_reader(self):
        chunks, _ = self.read(self.parts, 568)
        self.assertExactCut(chunks, range(N_DOCS), 568)  # the remainder carries across files

    def test_file_level_sharding(self):
        docs_of = [range(a, b) for a, b in zip(self.bounds, self.bounds[1:])]
        # Two processes, three files: files r::2.
        chunks0, idx0 = self.read(self.parts, 141, rank=0, world_size=2)
        chunks1, idx1 = self.read(self.parts, 141, rank=1, world_size=2)
        self.assertExactCut(chunks0, [*docs_of[0], *docs_of[2]], 141)
        self.assertExactCut(chunks1, docs_of[1], 141)
        self.assertLen(set(idx0 + idx1), len(idx0) + len(idx1))
        # Three processes, three files: one file each.
        for rank in range(3):
            chunks, _ = self.read(self.parts, 141, rank=rank, world_size=3)
            self.assertExactCut(chunks, docs_of[rank], 141)

    def test_more_readers_than_files_stride_documents_across_files(self):
        for rank in range(4):
            chunks, _ = self.read(self.parts, 141, rank=rank, world_size=4)
            self.assertExactCut(chunks, range(rank, N_DOCS, 4), 141)

    # --- shuffle buffer -----------------------------------------------------------------------

    def test_shuffle_buffer_permutes_within_its_bound(self):
        plain, _ = self.read([self.path], 141)
        position = {row: i for i, row in enumerate(_rows(plain))}
        self.assertLen(position, len(plain))  # real text: every chunk distinct, so positions are exact
        shuffled, idx = self.read([self.path], 141, shuffle_buffer=8, seed=3)
        order = [position[row] for row in _rows(shuffled)]
        self.assertCountEqual(order, range(len(plain)))  # nothing lost, nothing duplicated
        self.assertNotEqual(order, list(range(len(plain))))
        # A buffer of 8 has read at most k + 9 chunks when it emits its k-th: a bounded shuffle.
        self.assertTrue(all(o <= k + 8 for k, o in enumerate(order)), order)
        self.assertLen(set(idx), len(idx))

    def test_shuffle_is_seeded_and_changes_with_epoch(self):
        first, _ = self.read([self.path], 568, shuffle_buffer=8, seed=3)
        again, _ = self.read([self.path], 568, shuffle_buffer=8, seed=3)
        np.testing.assert_array_equal(first, again)
        other_seed, _ = self.read([self.path], 568, shuffle_buffer=8, seed=4)
        stream = corpus.PackedStream([self.path], self.tok, 568, shuffle_buffer=8, seed=3, cycle=False)
        stream.set_epoch(1)
        epoch1 = np.stack([row["input_ids"] for row in stream])
        stream.set_epoch(0)
        np.testing.assert_array_equal(np.stack([row["input_ids"] for row in stream]), first)
        for other in (other_seed, epoch1):
            self.assertCountEqual(_rows(other), _rows(first))
            self.assertFalse(np.array_equal(other, first))

    # --- cycling --------------------------------------------------------------------------------

    def test_cycle_repeats_the_pass(self):
        one_pass, _ = self.read([self.path], 568)
        n = len(one_pass)
        stream = corpus.PackedStream([self.path], self.tok, 568)  # cycle=True is the default
        rows = list(itertools.islice(stream, 2 * n + 1))
        self.assertLen(rows, 2 * n + 1)
        chunks = np.stack([row["input_ids"] for row in rows])
        np.testing.assert_array_equal(chunks[:n], one_pass)
        np.testing.assert_array_equal(chunks[n:2 * n], one_pass)  # unshuffled: the same order again
        np.testing.assert_array_equal(chunks[2 * n], one_pass[0])
        idx = [row["idx"] for row in rows]
        self.assertLen(set(idx), 2 * n + 1)

    def test_cycle_with_shuffle_reshuffles_each_pass(self):
        one_pass, _ = self.read([self.path], 568)
        n = len(one_pass)
        stream = corpus.PackedStream([self.path], self.tok, 568, shuffle_buffer=8, seed=5, cycle=True)
        rows = list(itertools.islice(stream, 2 * n + 1))
        chunks = np.stack([row["input_ids"] for row in rows])
        self.assertCountEqual(_rows(chunks[:n]), _rows(one_pass))
        self.assertCountEqual(_rows(chunks[n:2 * n]), _rows(one_pass))
        self.assertFalse(np.array_equal(chunks[:n], chunks[n:2 * n]))
        self.assertIn(tuple(chunks[2 * n]), set(_rows(one_pass)))
        idx = [row["idx"] for row in rows]
        self.assertLen(set(idx), 2 * n + 1)

    def test_cycle_over_a_corpus_without_a_chunk_ends(self):
        path = _write(os.path.join(self.dir, "small.txt"), self.lines[0] + "\n")
        stream = corpus.PackedStream([path], self.tok, 10_000, cycle=True)
        self.assertEqual(list(itertools.islice(stream, 3)), [])  # no endless loop of empty passes

    # --- data-loader workers --------------------------------------------------------------------

    def expected_strided(self, readers, members, chunk_length):
        """Rows of the readers `members` out of `readers` document-strided readers."""
        rows = []
        for r in members:
            rows += _rows(self.packed(range(r, N_DOCS, readers), chunk_length)[0])
        return rows

    @parameterized.named_parameters(("files_unbatched", "files", None), ("files_batched", "files", 3),
                                    ("iterable_dataset", "iterable_dataset", None))
    def test_two_workers_read_each_chunk_once(self, source, batch_size):
        if source == "files":
            sources = [self.path]
        else:
            sources = corpus.load_documents([self.path], None, None, "train", "text", streaming=True)
            self.assertIsInstance(sources, datasets.IterableDataset)
        stream = corpus.PackedStream(sources, self.tok, 568, cycle=False)
        loader = torch.utils.data.DataLoader(stream, batch_size=batch_size, num_workers=2, collate_fn=_keep)
        rows = [row for item in loader for row in ([item] if batch_size is None else item)]
        # Worker w reads documents w::2 and packs them on its own.
        self.assertCountEqual(_rows(row["input_ids"] for row in rows), self.expected_strided(2, (0, 1), 568))
        idx = [int(row["idx"]) for row in rows]
        self.assertLen(set(idx), len(idx))

    def test_workers_of_the_second_process(self):
        stream = corpus.PackedStream([self.path], self.tok, 568, cycle=False, rank=1, world_size=2)
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2, collate_fn=_keep)
        rows = list(loader)
        # Four readers in all: process 1's workers are readers 2 and 3.
        self.assertCountEqual(_rows(row["input_ids"] for row in rows), self.expected_strided(4, (2, 3), 568))

    def test_load_documents_bad_input_is_a_usage_error(self):
        bad = _write(os.path.join(self.dir, "b.jsonl"), '{"text": "fine"}\n{"title": "t"}\n')
        for streaming in (False, True):
            with self.assertRaisesRegex(UsageError, re.escape(f"{bad} line 2 has no field 'text'")):
                list(corpus.load_documents([bad], None, None, "train", "text", streaming=streaming))
        blank = _write(os.path.join(self.dir, "blank.txt"), "\n  \n\n")
        with self.assertRaisesRegex(UsageError, "no text"):
            corpus.load_documents([blank], None, None, "train", "text", streaming=False)

    def test_load_documents_reads_an_edited_file_again(self):
        path = _write(os.path.join(self.dir, "edited.txt"), "one\ntwo\n")
        self.assertEqual(list(corpus.load_documents([path], None, None, "train", "text", False)["text"]),
                         ["one", "two"])
        _write(path, "three\nfour\nfive\n")
        self.assertEqual(list(corpus.load_documents([path], None, None, "train", "text", False)["text"]),
                         ["three", "four", "five"])

    # --- take_chunks ----------------------------------------------------------------------------

    def test_take_chunks(self):
        stream = corpus.PackedStream([self.path], self.tok, 568, shuffle_buffer=8, seed=1, cycle=False)
        first, _ = self.read([self.path], 568, shuffle_buffer=8, seed=1)
        taken = corpus.take_chunks(stream, 5)
        self.assertLen(taken, 5)
        self.assertIsInstance(taken[0]["input_ids"], np.ndarray)  # numpy rows for the collator
        np.testing.assert_array_equal(np.asarray(taken["input_ids"]), first[:5])
        np.testing.assert_array_equal(np.asarray(taken["idx"]), np.arange(5))
        everything = corpus.take_chunks(stream, 10_000)  # fewer chunks than asked for: all of them
        self.assertLen(everything, len(first))
        # The limit is honoured without reading one chunk more from a never-ending stream.
        endless = iter(corpus.PackedStream([self.path], self.tok, 568, cycle=True))
        self.assertLen(corpus.take_chunks(endless, 3), 3)
        np.testing.assert_array_equal(next(endless)["input_ids"], self.packed(range(N_DOCS), 568)[0][3])

    def test_take_chunks_of_an_empty_stream(self):
        path = _write(os.path.join(self.dir, "small.txt"), self.lines[0] + "\n")
        with self.assertRaisesRegex(UsageError, "less than one chunk"):
            corpus.take_chunks(corpus.PackedStream([path], self.tok, 568, cycle=False), 10)
        with self.assertRaisesRegex(UsageError, "less than one chunk"):
            corpus.take_chunks(iter([]), 10)


if __name__ == "__main__":
    absltest.main()
