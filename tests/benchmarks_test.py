"""The benchmark scripts run: each in --quick mode (most in the test process), checked through the JSON it writes.

Quick mode checks that a script works, not its speed, so it reads the data the tests make
(made_data.py, through T5_TRAINING_DATA) rather than the real files, and timings are only required to be
positive; the values that do not depend on the machine (FLOP counts, chunk counts, the
collator's own correctness checks) are checked exactly.
"""

import contextlib
import importlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from unittest import mock

import torch
import transformers
from absl.testing import absltest

from t5_training.errors import UsageError
from tests import cli_batch, fixtures, made_data

BENCHMARKS = os.path.join(fixtures.REPO, "benchmarks")
# Offline, and OpenMP threads that sleep rather than spin when idle: on a CI machine shared with
# other jobs, spinning threads slow a quick run several-fold.
QUICK_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
             "OMP_WAIT_POLICY": "PASSIVE"}


def _quick_env() -> dict:
    """The environment of a --quick run: offline, passive OpenMP threads, and the made data as T5_TRAINING_DATA."""
    return {**os.environ, **QUICK_ENV, "T5_TRAINING_DATA": made_data.data_root()}


def run_in_process(script: str, argv: list[str]) -> tuple[object, str]:
    """The benchmark's main(argv) in this process, as `python benchmarks/SCRIPT` runs it; (its result, its stdout).

    What the script changes for its runs (variables, torch threads) is undone when it returns. Its
    own folder goes last on the path, where _harness puts it (peft.py must not hide the peft
    package), and it is loaded under another name for the same reason. _harness and the benchmarks
    that copy its data paths are reloaded so that they read the made data (T5_TRAINING_DATA).
    """
    if BENCHMARKS not in sys.path:
        sys.path.append(BENCHMARKS)
    stdout, threads = io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.ExitStack() as stack, mock.patch.dict(os.environ, _quick_env()), \
                contextlib.redirect_stdout(stdout):
            for name in ("_harness", "pretraining_transfer"):
                if name in sys.modules:
                    importlib.reload(sys.modules[name])
            harness = importlib.import_module("_harness")
            # Its runs' "fresh processes" fork from this one: the same code in a process of its own, without
            # the 8 s of imports a start costs (a quick run checks results, not timings).
            stack.enter_context(mock.patch.object(harness, "start_child", cli_batch.fork_script))
            return load_benchmark(script).main(argv), stdout.getvalue()
    finally:
        torch.set_num_threads(threads)


def load_benchmark(script: str):
    """A benchmark script as a module, its functions to call, under another name (as run_in_process)."""
    if BENCHMARKS not in sys.path:
        sys.path.append(BENCHMARKS)
    spec = importlib.util.spec_from_file_location(f"benchmark_{script[:-3]}", os.path.join(BENCHMARKS, script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BenchmarksTest(fixtures.TempDirTestCase):

    def run_quick(self, script: str, *extra: str, subprocess_: bool = False) -> dict:
        """The script's --quick run, read back from its JSON: in this process (a process start is 8 s
        of imports), or, for the scripts that measure their own process's memory, as a subprocess."""
        output = os.path.join(self.dir, "results.json")
        argv = ["--quick", "--output", output, *extra]
        if subprocess_:
            done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *argv], cwd=fixtures.REPO,
                                  capture_output=True, text=True, timeout=600, env=_quick_env())
            self.assertEqual(done.returncode, 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        else:
            run_in_process(script, argv)
        with open(output, encoding="utf-8") as f:
            return json.load(f)

    def test_attention_kernels(self):
        results = self.run_quick("attention_kernels.py")
        sides = results["sides"]
        # On a CPU: no direct efficient-kernel side (CUDA only), and the dispatcher's choice shows
        # what the benchmark is about: a mask that needs a gradient gets the math kernel, a
        # constant one the fused kernel.
        self.assertEqual(sorted(sides), ["sdpa, bias constant", "sdpa, bias trained"])
        self.assertEqual(sides["sdpa, bias trained"]["speedup"], 1.0)  # the reference side
        self.assertIn("_scaled_dot_product_attention_math", sides["sdpa, bias trained"]["kernels"])
        self.assertNotIn("_math", sides["sdpa, bias constant"]["kernels"])
        self.assertEqual(len(sides["sdpa, bias trained"]["seconds"]), 2)

    def test_pretraining_mfu(self):
        results = self.run_quick("pretraining_mfu.py")
        # 128-token inputs corrupt from 141 raw tokens into 29 targets (T5's random_spans_helper).
        self.assertEqual((results["raw_length"], results["source_length"], results["target_length"]), (141, 128, 29))
        check = results["flop_check"]
        # Forward: every matmul FlopCounterMode sees is in the analytic count, and nothing else.
        self.assertEqual(check["counted_forward"], check["analytic_forward"])
        self.assertEqual(check["analytic_train_step"], 3 * check["analytic_forward"])
        # The step differs only by the flash-attention backward recomputing its scores.
        self.assertLess(abs(check["relative_difference"]), 0.02)
        self.assertEqual(results["goal_mfu"], 0.5)  # a CPU's; a GPU's is 40% (issue's T5 v1.1-base goal)
        self.assertGreater(results["peak_flops_per_second"], 0)
        self.assertEqual([b["batch_size"] for b in results["batch_sizes"]], [1, 2])
        for entry in results["batch_sizes"]:
            self.assertEqual(entry["model_flops_per_step"], entry["batch_size"] * check["analytic_train_step"])
            self.assertGreater(entry["step_seconds_median"], 0)
            self.assertGreater(entry["tokens_per_second"], 0)
            self.assertTrue(0 < entry["mfu"] < 1.5, entry["mfu"])
        profile = results["profile"]
        self.assertLen(profile["top_ops"], 8)
        self.assertTrue(0 < profile["matmul_share"] <= 1, profile["matmul_share"])
        self.assertIn("aten::mm", [op["op"] for op in profile["top_ops"]])
        # Each SDPA call ran one kernel, which the profile names: on the CPU, the math path where the
        # bias is trained (dropout is on), the CPU flash kernel for cross-attention.
        attention = profile["attention_ops"]
        kernels = {op: n for op, n in attention.items() if op != "aten::scaled_dot_product_attention"
                   and not op.endswith("_backward")}
        self.assertEqual(set(kernels), {"aten::_scaled_dot_product_attention_math",
                                        "aten::_scaled_dot_product_flash_attention_for_cpu"})
        self.assertEqual(sum(kernels.values()), attention["aten::scaled_dot_product_attention"])

    def test_collator_speed(self):
        results = self.run_quick("collator_speed.py", subprocess_=True)  # and a script start
        self.assertEqual((results["raw_length"], results["input_length"], results["target_length"]), (568, 512, 114))
        self.assertEqual(sorted(results["checks"]), ["per-example", "vectorised"])
        self.assertTrue(all(check.startswith("ok") for check in results["checks"].values()))
        self.assertEqual([b["batch_size"] for b in results["batch_sizes"]], [8, 64])
        for entry in results["batch_sizes"]:
            self.assertGreater(entry["vectorised_examples_per_second"], 0)
            self.assertGreater(entry["per-example_examples_per_second"], 0)
            self.assertGreater(entry["speedup"], 0)
        mixture = results["ul2_mixture"]
        self.assertEqual((mixture["batch_size"], mixture["raw_lengths"]),
                         (64, {"ul2 mixture": 1004, "span corruption": 568}))
        self.assertTrue(mixture["check"].startswith("ok"))
        self.assertGreater(mixture["ratio"], 0)

    def test_compile_speed(self):
        # aot_eager: the benchmark's wiring, without inductor's C++ compile time.
        results = self.run_quick("compile_speed.py", "--backend", "aot_eager", "--work_dir", self.dir)
        runs = {run["side"]: run for run in results["runs"]}
        self.assertEqual(sorted(runs), sorted(["pretraining eager", "pretraining compiled", "fine-tuning eager",
                                               "fine-tuning compiled, widths", "fine-tuning compiled, symbolic"]))
        for side, run in runs.items():
            self.assertLen(run["step_seconds"], 8)
            self.assertEqual(run["graphs"] > 0, "compiled" in side, side)  # eager compiles nothing
            self.assertGreater(run["steady_ms"], 0)
        # One shape in pretraining; symbolic lengths in fine-tuning: one compile each, at the first step.
        for side in ("pretraining compiled", "fine-tuning compiled, symbolic"):
            self.assertEqual(runs[side]["graphs_per_step"][1:], [0] * 7, side)
        self.assertEqual(sorted(results["compiled_over_eager"]), ["fine-tuning, symbolic", "fine-tuning, widths",
                                                                  "pretraining"])

    def test_the_project_side_runs_the_fused_gelu_and_one_side_the_written_one(self):
        # Every side trains T5 v1.1's GELU as load_model has the scripts train it, but the one side
        # that shows what fusing it gains.
        import accelerate

        from t5_training.config import TrainingConfig

        module = load_benchmark("pretraining_mfu.py")
        # A v1.1 config as a JSON file gives it: the flag false, which transformers 5 reads as "unscaled".
        cfg = transformers.T5Config(vocab_size=32, d_model=8, d_ff=16, d_kv=4, num_heads=2, num_layers=1,
                                    num_decoder_layers=1, relative_attention_num_buckets=4,
                                    feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                    decoder_start_token_id=0, pad_token_id=0)
        fixtures.reset_accelerate_state()
        self.addCleanup(fixtures.reset_accelerate_state)
        accelerator = accelerate.Accelerator(cpu=True)
        run_config = TrainingConfig(output_dir="unused", max_steps=1)
        acts = {}
        for written in (False, True):
            model, _ = module.build(cfg, run_config, accelerator, gelu_as_written=written)
            acts[written] = type(model.encoder.block[0].layer[1].DenseReluDense.act).__name__
            # Every side, the second built from the same config too, has the scripts' layout.
            self.assertIs(model.encoder.embed_tokens.weight, model.shared.weight)
            self.assertIsNot(model.lm_head.weight, model.shared.weight)
        self.assertEqual(acts, {False: "GELU", True: "NewGELUActivation"})

    def test_fused_norms_compute_what_transformers_does(self):
        # The MFU benchmark's fused variant must differ from T5's modules only in its kernels.
        from transformers import T5ForConditionalGeneration

        module = load_benchmark("pretraining_mfu.py")
        cfg = fixtures.tiny_t5_config(feed_forward_proj="gated-gelu", dropout_rate=0.0, tie_word_embeddings=False,
                                      decoder_start_token_id=0, pad_token_id=0)
        generator = torch.Generator().manual_seed(0)
        ids, labels = torch.randint(2, 32, (2, 12), generator=generator), torch.randint(2, 32, (2, 5), generator=generator)
        results = []
        for fused in (False, True):
            torch.manual_seed(0)
            model = T5ForConditionalGeneration(cfg).train()
            if fused:
                module.fuse_norms(model)
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
        (loss, grads), (fused_loss, fused_grads) = results
        self.assertNotEqual(model.decoder.final_layer_norm.forward.__func__.__name__, "forward")  # it was swapped
        torch.testing.assert_close(fused_loss, loss, rtol=1e-6, atol=1e-6)
        # The fused kernels sum in another order: fp32 rounding, to a few 1e-7 of each tensor's scale
        # whatever the CPU's vector width. A different formula (GELU without its tanh form) is 1e-3 apart.
        for name, grad in grads.items():
            if grad is None:  # a weight this step does not reach: none on either side
                self.assertIsNone(fused_grads[name], name)
                continue
            torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-5 * grad.abs().max().item(),
                                       msg=lambda m, name=name: f"{name}: {m}")

    def test_saved_tensors_census_equals_the_tracer(self):
        # The census a GPU run reports (what autograd saved, storage by storage) counts what the
        # estimate's tracer counts: on the CPU, where the tracer is exact, the two are equal.
        from transformers import T5ForConditionalGeneration

        from t5_training.losses import token_cross_entropy_sum
        from t5_training.tools import activation_memory

        module = load_benchmark("memory_estimator.py")
        cfg = fixtures.tiny_t5_config(num_layers=2, num_decoder_layers=2)
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(cfg).train()
        census = module.SavedTensors(model)
        with torch.autograd.graph.saved_tensors_hooks(census.pack, lambda t: t):
            logits = model(input_ids=torch.randint(2, 32, (2, 12)), attention_mask=torch.ones(2, 12, dtype=torch.long),
                           decoder_input_ids=torch.randint(2, 32, (2, 5))).logits
            token_cross_entropy_sum(logits, torch.randint(2, 32, (2, 5)))
        census.end_step()
        tape, _ = activation_memory.trace(cfg, batch=2, source=12, target=5, device="cpu", precision="fp32",
                                          pure16=False, trainable={"embeddings": True, "encoder": True,
                                                                   "decoder": True}, checkpointing=False,
                                          padding=False)
        (step,) = census.steps
        self.assertEqual(step["bytes"], sum(tape.bytes[k] for k in tape.saved_by()))
        self.assertEqual(step["storages"], len(tape.saved_by()))
        self.assertEqual(census.storages, {})  # the next step starts a record of its own

    def test_memory_estimator(self):
        results = self.run_quick("memory_estimator.py", subprocess_=True)
        self.assertEqual((results["device"], results["steps"]), ("cpu", 2))
        (row,) = results["rows"]
        self.assertEqual((row["config"], row["batch"], row["lengths"], row["optim"]), ("t5-tiny", 16, "128->8",
                                                                                       "adamw_torch"))
        estimate = row["estimate"]
        # fp32 weights and gradients, and AdamW's two fp32 moments per trainable weight.
        self.assertEqual(estimate["weights"], 4 * estimate["parameters"])
        self.assertEqual(estimate["gradients"], 4 * estimate["trainable_parameters"])
        self.assertEqual(estimate["optimizer_state"], 8 * estimate["trainable_parameters"])
        self.assertGreater(estimate["activations"], 0)
        self.assertBetween(estimate["total"], estimate["weights"] + estimate["optimizer_state"],
                           sum(estimate[k] for k in ("weights", "gradients", "optimizer_state", "activations")))
        self.assertLen(row["step_peaks"], 2)
        self.assertGreater(row["measured_bytes"], 0)
        # The census of what autograd saved equals the tracer's saved bytes on the CPU, and names the
        # SDPA kernel that ran: the math path, since dropout is on (the tracer's CPU rule).
        self.assertEqual(row["saved"]["bytes"], estimate["saved_for_backward"])
        self.assertEqual(row["saved"]["attention_ops"], {"aten::scaled_dot_product_attention": 6,
                                                         "aten::_scaled_dot_product_attention_math": 6})
        self.assertAlmostEqual(row["error %"], 100 * (estimate["total"] - row["measured_bytes"])
                               / row["measured_bytes"], delta=0.1)

    def test_fine_tune_throughput(self):
        # Three of the five sides: "ours" and "hf dynamic padding" are the first two without
        # --group_by_length, the same code with one flag off (a process each, 10 s of the suite).
        sides = ["ours group_by_length", "hf group_by_length", "hf pad to max length"]
        results = self.run_quick("fine_tune_throughput.py", "--work_dir", os.path.join(self.dir, "work"),
                                 "--sides", *sides)
        self.assertEqual([row["side"] for row in results["table"]], sides)
        self.assertCountEqual([run["side"] for run in results["runs"]], sides)
        for run in results["runs"]:
            # Every side trained the same number of steps of the same batch, in one thread.
            self.assertEqual((run["steps"], run["threads"]), (4, 1), run["side"])
            # (train_results.json rounds its runtime to 10 ms.)
            self.assertAlmostEqual(run["samples_per_second"], 4 * 8 / run["seconds"],
                                   delta=0.02 * run["samples_per_second"], msg=run["side"])
            self.assertGreater(run["tokens_per_second"], 0, run["side"])
            self.assertTrue(0 < run["train_loss"] < 20, run["train_loss"])
            self.assertEqual(run["compiled_graphs"], 0, run["side"])
        # One epoch over the same rows on every side: the same non-padding tokens, whatever the
        # sampler or the padding, so that no side is timed on shorter sentences.
        self.assertEqual(results["settings"]["train_rows"], 4 * 8)
        self.assertEqual({run["tokens"] for run in results["runs"]}, {results["runs"][0]["tokens"]})
        self.assertGreater(results["runs"][0]["tokens"], 4 * 8 * 3)
        self.assertCountEqual(results["ratios"], ["ours group_by_length / hf group_by_length",
                                                  "ours group_by_length / hf pad to max length"])
        self.assertCountEqual(results["goals"], ["ours group_by_length / hf group_by_length >= 1.0",
                                                 "ours group_by_length / hf pad to max length >= 2.0"])

    def test_fine_tune_throughput_compiled(self):
        # Both compiled sides (aot_eager: the wiring, without inductor's C++ compile), timed after
        # their first 2 of 4 steps, when the compile is done.
        sides = ["ours compiled", "hf compiled"]
        results = self.run_quick("fine_tune_throughput.py", "--work_dir", os.path.join(self.dir, "work"),
                                 "--sides", *sides, "--compile_backend", "aot_eager", "--untimed_steps", "2")
        self.assertEqual([row["side"] for row in results["table"]], sides)
        for run in results["runs"]:
            self.assertEqual((run["steps"], run["threads"]), (2, 1), run["side"])
            self.assertAlmostEqual(run["samples_per_second"], 2 * 8 / run["seconds"],
                                   delta=0.01 * run["samples_per_second"], msg=run["side"])
            self.assertGreater(run["tokens"], 2 * 8 * 3, run["side"])
            self.assertGreater(run["compiled_graphs"], 0, run["side"])
        self.assertIn("ours compiled / hf compiled", results["ratios"])

    def test_eval_throughput(self):
        results = self.run_quick("eval_throughput.py", "--work_dir", os.path.join(self.dir, "work"))
        sides = ["ours score", "ours generate", "hf predict_with_generate"]
        self.assertEqual([row["side"] for row in results["table"]], sides)
        # What does not depend on the machine: every side predicts every row exactly as HF's greedy
        # generation does, so the accuracies are equal too.
        self.assertEqual(results["predictions_identical"], {"ours score": True, "ours generate": True})
        self.assertEqual([row["rows differing from hf"] for row in results["table"]], [0, 0, 0])
        self.assertLen(set(results["accuracy"].values()), 1)
        for run in results["runs"]:
            self.assertEqual(run["rows"], 64, run["side"])
            self.assertGreater(run["examples_per_second"], 0, run["side"])
        # The teacher-forced dev loss is the same computation on both sides.
        losses = [run["loss"] for run in results["runs"]]
        self.assertLess(max(losses) - min(losses), 1e-3 * max(losses), losses)

    def test_mixture_against_each_task_alone(self):
        # 10 mixture steps of 16 on 200 rows a task, then each task alone for as many of its rows.
        results = self.run_quick("mixture_vs_single.py", "--output_dir", os.path.join(self.dir, "runs"))
        rates = results["rates"]
        self.assertEqual(sorted(rates), ["cola", "mrpc", "sst2", "stsb"])
        self.assertEqual(sum(rate["rows_trained"] for rate in rates.values()), 10 * 16)
        for row in results["table"]:
            self.assertEqual(row["alone_steps"], -(-rates[row["task"]]["rows_trained"] // 16))
        self.assertEqual(len(results["table"]), 6)  # MRPC and STS-B have two metrics each
        self.assertEqual(results["submission"], ["CoLA.tsv", "MRPC.tsv", "SST-2.tsv", "STS-B.tsv"])
        self.assertEqual(set(results["glue_score"]), {"mixture", "alone"})

    def test_streaming_memory(self):
        results = self.run_quick("streaming_memory.py", "--tokenizer", fixtures.tokenizer_dir())
        self.assertEqual(results["sizes_mb"], [0.2, 2.0])
        rows = results["rows"]
        self.assertEqual([(r["reader"], r["multiple"]) for r in rows], [("stream", 1.0), ("stream", 10.0)])
        # Ten times the text packs into about ten times the chunks.
        self.assertBetween(rows[1]["chunks"] / rows[0]["chunks"], 9, 11)
        for row in rows:
            self.assertGreater(row["peak_mb"], row["baseline_mb"] - 1)
            self.assertGreater(row["tokens_per_s"], 0)
        self.assertGreater(results["streaming_peak_rss_ratio"], 0)
        self.assertAlmostEqual(results["streaming_peak_rss_ratio"], rows[1]["peak_mb"] / rows[0]["peak_mb"])
        self.assertEqual(results["largest_multiple"], 10.0)


class PeakMemoryTest(absltest.TestCase):
    """A benchmark's run reports its own process's peak memory, not its parent's."""

    def test_a_process_started_by_fork_and_exec_reports_its_own_peak(self):
        # The parent (this process) holds 512 MiB more than the child will ever touch: getrusage's
        # ru_maxrss, which the peft benchmark read before, carries the parent's peak into the child.
        ballast = bytearray(b"\x01") * (512 << 20)
        child = ("import sys; sys.path.insert(0, sys.argv[1]); import _harness, resource; "
                 "print(_harness.peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
        out = subprocess.run([sys.executable, "-c", child, BENCHMARKS], capture_output=True, text=True, check=True)
        peak, inherited = map(float, out.stdout.split())
        self.assertGreater(inherited, 512, "the parent's ballast is not resident: this test could not fail")
        self.assertLess(peak, 256)
        self.assertEqual(len(ballast), 512 << 20)


class PretrainingTransferTest(fixtures.TempDirTestCase):
    """benchmarks/pretraining_transfer.py at a toy size: paired runs, the interval, reuse of finished runs."""

    def test_pairs_are_scored_summarized_and_reused(self):
        sys.path.insert(0, BENCHMARKS)
        self.addCleanup(sys.path.remove, BENCHMARKS)
        import pretraining_transfer

        out = os.path.join(self.dir, "study")
        # One run at a time: at this toy size starting worker processes costs more than the runs
        # (demo_test covers runs side by side).
        # One labelled size (a row of the table; sizes are a loop over the same code), two seeds.
        flags = ["--output_dir", out, "--pretrain_steps", "3", "--fine_tune_steps", "2", "--labelled", "10",
                 "--max_eval_samples", "32", "--processes", "1"]
        first = pretraining_transfer.main(flags + ["--seeds", "0", "1"])
        rows = first["recipes"]["t5_adafactor"]["rows"]
        self.assertEqual([row["labelled"] for row in rows], [10])
        for row in rows:
            differences = [p - r for p, r in zip(row["pretrained accuracy"], row["random init accuracy"])]
            self.assertAlmostEqual(row["difference"]["mean"], sum(differences) / 2)
            self.assertLessEqual(row["difference"]["low"], row["difference"]["mean"])
            self.assertEqual(row["difference"]["pairs"], 2)
        self.assertEqual(first["recipes"]["t5_adafactor"]["pretraining"]["train"]["train_steps"], 3)
        self.assertTrue(os.path.isfile(os.path.join(out, "transfer.png")))

        # A third seed: the runs that finished are read back unchanged, only the new pairs train.
        model = os.path.join(out, "fine_tune-t5_adafactor-3", "labelled10", "pretrained-seed0", "final",
                             "model.safetensors")
        before = os.stat(model).st_mtime_ns
        second = pretraining_transfer.main(flags + ["--seeds", "0", "1", "2"])
        self.assertEqual(os.stat(model).st_mtime_ns, before)
        again = second["recipes"]["t5_adafactor"]["rows"][0]
        self.assertEqual(again["pretrained accuracy"][:2], rows[0]["pretrained accuracy"])
        self.assertLen(again["pretrained accuracy"], 3)
        self.assertTrue(os.path.isdir(os.path.join(out, "fine_tune-t5_adafactor-3", "labelled10", "random_init-seed2")))

        # A finished run is never passed off as another setting's: other flags are refused, nothing trains.
        with self.assertRaisesRegex(UsageError, r"labelled10/pretrained-seed0 holds a finished run trained with "
                                                r"other flags \(.*--learning_rate.*\)"):
            pretraining_transfer.main(flags + ["--seeds", "0", "--learning_rate", "3e-4"])
        self.assertEqual(os.stat(model).st_mtime_ns, before)


class PeftBenchmarkTest(fixtures.TempDirTestCase):
    """benchmarks/peft.py at a toy size: methods side by side, paired seeds, reuse of finished runs.

    The script runs in this process; its runs are still processes of their own.
    """

    def test_methods_are_measured_side_by_side_and_reused(self):
        from t5_training import modeling

        base = os.path.join(self.dir, "base")
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        model = modeling.load_model(None, fixtures.TINY_CONFIG, tokenizer)
        model.save_pretrained(base)
        tokenizer.save_pretrained(base)
        out = os.path.join(self.dir, "out")
        argv = ["--pretrained", base, "--methods", "full", "lora", "--seeds", "0", "1", "--steps", "3",
                "--labelled", "24", "--threads", "1", "--output_dir", out, "--study_dir", os.path.join(self.dir, "study")]
        results, stdout = run_in_process("peft.py", argv)
        with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
            self.assertEqual(json.load(f)["table"], results["table"])
        rows = {row["method"]: row for row in results["table"]}
        # Full fine-tuning trains every weight (the tied embedding once); LoRA r=7 on all six linear
        # layers trains 7 x (d_in + d_out) per matrix: per encoder layer q, k, v, o (128 -> 128), wi
        # (128 -> 512) and wo (512 -> 128); per decoder layer twice the attention matrices.
        self.assertEqual(rows["full"]["trainable"], sum(p.numel() for p in model.parameters()))
        self.assertEqual(rows["lora"]["trainable"], 7 * 2 * (4 * 256 + 2 * 640 + 8 * 256 + 2 * 640))
        # The adapter's checkpoint holds its weights and Adam's two moments (fp32), plus RNG and
        # schedule state: 8% of full fine-tuning's with this fixture's small vocabulary (4.5% with
        # the benchmark's t5-tiny, whose embeddings are larger).
        self.assertGreater(rows["lora"]["checkpoint MiB"], 3 * 4 * rows["lora"]["trainable"] / 2**20)
        self.assertLess(rows["lora"]["checkpoint MiB"], 0.1 * rows["full"]["checkpoint MiB"])
        self.assertEqual(rows["full"]["vs full (95% interval)"], "+0.00 (+0.00 to +0.00)")
        self.assertLen(rows["lora"]["per seed"].split(), 2)
        self.assertIn("lora", stdout)
        self.assertEqual(stdout.count("done in"), 4)  # each run in a process of its own
        # Runs that ended at one label, as each run's last evaluation recorded it.
        for method in ("full", "lora"):
            recorded = []
            for seed in (0, 1):
                with open(os.path.join(out, f"{method}-seed{seed}", "benchmark.json"), encoding="utf-8") as f:
                    recorded.append(json.load(f)["result"]["one_label"])
            self.assertEqual(rows[method]["one-label runs"], sum(recorded))

        # A run measured before evaluation recorded one_label: read from its dev predictions instead.
        older = os.path.join(out, "lora-seed0", "benchmark.json")
        with open(older, encoding="utf-8") as f:
            saved_run = json.load(f)
        for key in ("top_label_share", "one_label"):
            del saved_run["result"][key]
        with open(older, "w", encoding="utf-8") as f:
            json.dump(saved_run, f)

        # Run again: every run is read back, none trains.
        saved = os.path.join(out, "lora-seed1", "benchmark.json")
        before = os.stat(saved).st_mtime_ns
        again, stdout = run_in_process("peft.py", argv)
        self.assertEqual(again["table"], results["table"])
        self.assertEqual(os.stat(saved).st_mtime_ns, before)
        self.assertNotIn("done in", stdout)

        # Other flags over finished runs: refused in one line that names the change; nothing retrained.
        with self.assertRaisesRegex(UsageError, "holds a finished run trained with other flags "
                                                r"\(--max_steps 3 -> 4\)"):
            run_in_process("peft.py", _with(argv, "--steps", "4"))
        self.assertEqual(os.stat(saved).st_mtime_ns, before)


def _with(command: list[str], flag: str, value: str) -> list[str]:
    command = list(command)
    command[command.index(flag) + 1] = value
    return command


if __name__ == "__main__":
    absltest.main()
