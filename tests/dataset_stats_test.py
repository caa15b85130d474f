"""Tests of t5_training.tools.dataset_stats: exact numbers on files of known token lengths, the
text histogram, real SST-2, the PNG and JSON outputs, and bad input (the numbers' rules:
length_stats_test.py)."""
from __future__ import annotations

import contextlib
import io
import json
import os

from absl.testing import absltest, parameterized

from t5_training import data
from t5_training.config import parse_config
from t5_training.errors import UsageError, run_cli
from t5_training.modeling import load_tokenizer
from t5_training.tasks import get_entry
from t5_training.tools import dataset_stats
from t5_training import denoisers as dn
from tests import made_data
from tests.fixtures import TempDirTestCase, sst2_dir, tokenizer_dir

# With the fixture tokenizer, "sst2 sentence: the the ... the" (k words) is ▁s st 2 ▁sentence : ,
# k times ▁the, then </s>: 6 + k tokens; a label word is one token plus </s>.
PREFIX_AND_EOS = 6


def run(argv: list[str]) -> tuple[dict, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        stats = dataset_stats.main(argv)
    return stats, out.getvalue()


class KnownLengthsTest(TempDirTestCase):
    """100 rows; row k (1..100) holds k words "the", so its source has 6 + k tokens (7..106)."""

    def setUp(self):
        super().setUp()
        self.file = os.path.join(self.dir, "dev.jsonl")
        with open(self.file, "w", encoding="utf-8") as f:
            for k in range(1, 101):
                f.write(json.dumps({"sentence": " ".join(["the"] * k), "label": k % 2}) + "\n")
        self.args = ["--validation_file", self.file, "--tokenizer_name", tokenizer_dir()]

    def test_tokenizer_counts_as_the_golden_lengths_say(self):
        tokenizer = load_tokenizer(tokenizer_dir())
        self.assertEqual([len(ids) for ids in tokenizer(["sst2 sentence: the", "sst2 sentence: the the the",
                                                         "negative", "positive"])["input_ids"]],
                         [PREFIX_AND_EOS + 1, PREFIX_AND_EOS + 3, 2, 2])

    def test_percentiles_and_truncation(self):
        # Planned source length 86 = 6 + 80: rows k = 81..100 are cut, 20 of 100.
        stats, text = run([*self.args, "--max_source_length", "86", "--max_target_length", "2"])
        self.assertEqual(list(stats["splits"]), ["validation"])
        source = stats["splits"]["validation"]["source"]
        self.assertEqual({k: source[k] for k in ("rows", "min", "p50", "p90", "p95", "p99", "max")},
                         {"rows": 100, "min": 7, "p50": 56, "p90": 96, "p95": 101, "p99": 105, "max": 106})
        self.assertEqual(source["mean"], 56.5)
        self.assertEqual((source["truncated_rows"], source["truncated_percent"]), (20, 20.0))
        # The longest row (106) is short: keep it whole, rounded up to 112; nothing is cut.
        self.assertEqual((source["suggested_length"], source["suggested_truncated_rows"]), (112, 0))
        target = stats["splits"]["validation"]["target"]
        self.assertEqual((target["rows"], target["mean"], target["max"], target["truncated_rows"]), (100, 2.0, 2, 0))
        self.assertEqual(stats["suggested"], {"source": 112, "target": 8})
        self.assertIn("  mean 56.5   min 7   p50 56   p90 96   p95 101   p99 105   max 106\n", text)
        self.assertIn("  truncated at 86: 20 rows (20.00%)\n", text)
        self.assertIn("  suggested --max_source_length 112: truncates 0 rows (0.00%)\n", text)
        self.assertIn("--max_source_length 112 --max_target_length 8", text)

    def test_histogram_of_the_file(self):
        stats, text = run(self.args)
        hist = stats["splits"]["validation"]["source"]["histogram"]
        # 100 lengths 7..106 in 10 bins of 10: ten rows each.
        self.assertEqual(hist, {"edges": list(range(7, 108, 10)), "counts": [10] * 10})
        self.assertIn("    7-16    10   10.00%  " + "#" * 40 + "\n", text)
        self.assertIn("  97-106    10   10.00%  " + "#" * 40 + "\n", text)

    def test_max_samples_takes_the_first_rows(self):
        stats, _ = run([*self.args, "--max_samples", "10"])
        source = stats["splits"]["validation"]["source"]
        self.assertEqual((source["rows"], source["max"]), (10, PREFIX_AND_EOS + 10))

    def test_png_and_json_are_written(self):
        png, json_path = os.path.join(self.dir, "lengths.png"), os.path.join(self.dir, "lengths.json")
        stats, _ = run([*self.args, "--png", png, "--json", json_path])
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(json_path, encoding="utf-8") as f:
            self.assertEqual(json.load(f), stats)
        # Nothing but the two outputs is written beside the data (task files are read without datasets' cache).
        self.assertEqual(sorted(os.listdir(self.dir)), sorted(["dev.jsonl", "lengths.json", "lengths.png"]))


class TextReportTest(absltest.TestCase):
    def test_text_bars_scale_to_the_largest_bin(self):
        lines = dataset_stats.format_histogram({"edges": [1, 2, 3, 4], "counts": [1000, 1, 0]})
        self.assertEqual(lines, ["  tokens   rows    share",
                                 "       1  1,000   99.90%  " + "#" * 40,
                                 "       2      1    0.10%  #",
                                 "       3      0    0.00%"])


class RealDataTest(TempDirTestCase):

    def test_sst2_dev_split_from_data_dir(self):
        args = ["--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", sst2_dir(), "--splits", "validation",
                "--tokenizer_name", tokenizer_dir(), "--max_source_length", "32", "--max_target_length", "8"]
        stats, text = run(args)
        self.assertEqual(list(stats["splits"]), ["validation"])
        source = stats["splits"]["validation"]["source"]
        self.assertEqual(source["rows"], made_data.SIZES["dev"])
        self.assertIn(f"== validation: {made_data.SIZES['dev']} rows ==", text)
        self.assertEqual(sum(source["histogram"]["counts"]), made_data.SIZES["dev"])
        # The same count of cut rows as the training path reports for these lengths.
        entry = get_entry("glue", "sst2")
        rows = data.load_splits(entry, data_dir=sst2_dir())["validation"]
        trained = data.tokenize_split(rows, entry, load_tokenizer(tokenizer_dir()), 32, 8)
        self.assertGreater(trained.truncated_sources, 0)
        self.assertEqual(source["truncated_rows"], trained.truncated_sources)
        self.assertEqual(stats["splits"]["validation"]["target"]["truncated_rows"], trained.truncated_targets)


class CorpusTest(TempDirTestCase):

    @parameterized.named_parameters(
        # k tokens each (T5 packs end to end): 210 tokens in chunks of 16 (17 - 1 for prefix LM):
        # 13 chunks, 2 dropped; 4 documents (17-20 tokens) exceed a chunk.
        ("end_to_end", [], (1, 20), (210, 13, 2), 4, "without an EOS between them"),
        # With an EOS after each: k + 1 tokens, 230 in all: 14 chunks, 6 dropped; 5 exceed a chunk.
        ("eos_between", ["--eos_between_documents"], (2, 21), (230, 14, 6), 5, "plus the EOS that separates"),
    )
    def test_document_lengths_and_packed_chunks(self, flags, lengths, packing, too_long, counted):
        path = os.path.join(self.dir, "corpus.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(" ".join(["the"] * k) + "\n" for k in range(1, 21))  # k tokens
        stats, text = run(["--corpus_file", os.path.join(self.dir, "*.txt"), "--tokenizer_name", tokenizer_dir(),
                           "--objective", "prefix_lm", "--max_seq_length", "17", *flags])
        documents = stats["splits"]["corpus"]["document"]
        self.assertIn(counted, stats["counted"])
        self.assertEqual((documents["rows"], documents["min"], documents["max"]), (20, *lengths))
        tokens, chunks, dropped = packing
        self.assertEqual({k: stats["packing"][k] for k in ("tokens", "chunks", "dropped_tokens", "chunk_length")},
                         {"tokens": tokens, "chunks": chunks, "dropped_tokens": dropped, "chunk_length": 16})
        self.assertEqual((documents["truncated_rows"], documents["truncated_percent"]), (too_long, too_long * 5.0))
        self.assertIn(f"  longer than one chunk (16 tokens): {too_long} documents ({too_long * 5.0:.2f}%), split "
                      "across chunks\n", text)
        self.assertIn(f"\n  {tokens} tokens make {chunks} chunks of 16 tokens; the last {dropped} tokens are dropped",
                      text)

    def test_ul2_packs_into_the_longest_raw_chunk_and_reports_the_dropped_share(self):
        path = os.path.join(self.dir, "corpus.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(" ".join(["the"] * k) + "\n" for k in range(1, 21))  # 210 tokens
        stats, text = run(["--corpus_file", path, "--tokenizer_name", tokenizer_dir(), "--objective", "ul2",
                           "--max_seq_length", "128"])
        # UL2's seven at 128 inputs: rows read 127 (S) to 248 (X, mean 64, density 0.5) raw tokens, as the collator.
        read = stats["packing"]["denoiser_raw_lengths"]
        self.assertEqual(list(read), [d.name for d in dn.UL2_DENOISERS])
        self.assertEqual((min(read.values()), stats["packing"]["chunk_length"]), (127, 248))
        self.assertEqual((stats["packing"]["chunks"], stats["packing"]["dropped_tokens"]), (0, 210))
        self.assertIn("UL2's mixture of 7 denoisers, 128 encoder tokens; rows read 127 to 248 tokens of each chunk, "
                      "29.7% of the packed tokens dropped at these rates", text)
        # A --denoisers file implies ul2 and its own lengths: R alone, 127 inputs after the mode token, reads 140.
        mixture = os.path.join(self.dir, "r.yaml")
        with open(mixture, "w", encoding="utf-8") as f:
            f.write('- {name: R, kind: span, mean_noise_span_length: 3, noise_density: 0.15, mode_token: "[NLU]", '
                    'rate: 1}\n')
        stats, text = run(["--corpus_file", path, "--tokenizer_name", tokenizer_dir(), "--denoisers", mixture,
                           "--max_seq_length", "128"])
        self.assertEqual((stats["packing"]["chunk_length"], stats["packing"]["chunks"]), (140, 1))
        self.assertIn("0.0% of the packed tokens dropped", text)

    def test_an_unset_objective_is_span_corruption_in_the_written_stats(self):
        path = os.path.join(self.dir, "corpus.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(" ".join(["the"] * k) + "\n" for k in range(1, 21))
        argv = ["--corpus_file", path, "--tokenizer_name", tokenizer_dir(), "--max_seq_length", "16",
                "--json", os.path.join(self.dir, "stats.json")]
        config = parse_config(dataset_stats.StatsConfig, argv)
        self.assertEqual((config.objective, config.resolved_objective), (None, "span_corruption"))
        run(argv)
        with open(os.path.join(self.dir, "stats.json"), encoding="utf-8") as f:
            written = json.load(f)["packing"]
        self.assertEqual(written["objective"], "span corruption at 0.15 noise, mean span 3: 16 encoder tokens")
        self.assertEqual(written["chunk_length"], dataset_stats.packing(config)[0])

    @parameterized.named_parameters(
        ("unset", [], None, "span_corruption"),
        ("a_denoisers_file_means_the_mixture", ["--denoisers", "m.yaml"], None, "ul2"),
        ("typed", ["--objective", "prefix_lm"], "prefix_lm", "prefix_lm"),
    )
    def test_objective_as_given_and_as_resolved(self, flags, given, resolved):
        config = parse_config(dataset_stats.StatsConfig, ["--corpus_file", "x.txt", *flags])
        self.assertEqual((config.objective, config.resolved_objective), (given, resolved))


class BadInputTest(TempDirTestCase):

    @parameterized.named_parameters(
        ("no_tokenizer", ["--data_dir", "{sst2}"], "no tokenizer: pass --tokenizer_name"),
        ("unknown_task", ["--dataset_name", "sst3", "--data_dir", "{sst2}", "--tokenizer_name", "{tok}"],
         "unknown --dataset_name 'sst3'"),
        ("unknown_split", ["--data_dir", "{sst2}", "--splits", "dev", "--tokenizer_name", "{tok}"],
         "unknown --splits 'dev' for glue/sst2; its splits: train, validation"),
        ("missing_tokenizer_folder", ["--tokenizer_name", "{dir}/no-such-tokenizer"], "no-such-tokenizer': no such file or folder"),
        ("corpus_and_task", ["--corpus_file", "x.txt", "--data_dir", "{sst2}"], "--corpus_file reads a pretraining"),
        ("png_folder_missing", ["--png", "{dir}/nowhere/a.png"], "create it first"),
        ("short_target", ["--max_target_length", "1"], "must be at least 2"),
        ("denoisers_without_ul2", ["--corpus_file", "x.txt", "--denoisers", "m.yaml", "--objective", "prefix_lm"],
         "--denoisers lists a mixture of denoisers, which --objective prefix_lm is not"),
        ("denoisers_file_missing", ["--corpus_file", "x.txt", "--tokenizer_name", "{tok}", "--denoisers",
                                    "{dir}/none.yaml"], "none.yaml: No such file or directory; pass a YAML file"),
    )
    def test_one_line_usage_error(self, argv, message):
        argv = [a.format(tok=tokenizer_dir(), dir=self.dir, sst2=sst2_dir()) for a in argv]
        with self.assertRaisesRegex(UsageError, message.replace("(", r"\(")):
            dataset_stats.main(argv)

    def test_cli_exits_2_with_one_line(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = run_cli(dataset_stats.main, ["--dataset_name", "sst3", "--tokenizer_name", tokenizer_dir()])
        self.assertEqual(code, 2)
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertTrue(err.getvalue().startswith("error: unknown --dataset_name 'sst3'"))


if __name__ == "__main__":
    absltest.main()
