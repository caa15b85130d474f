"""Pretraining model FLOPs utilisation (MFU): how much of the machine's matmul peak a T5 training step uses.

    python benchmarks/pretraining_mfu.py            # t5-small, 512 -> 114 tokens, batches 1 2 4 8: ~6 min, 2 cores
    python benchmarks/pretraining_mfu.py --threads 1 --output runs/pretraining_mfu_1thread.json
    python benchmarks/pretraining_mfu.py --quick    # t5-tiny, 128-token inputs: checks that it runs, not its speed

The model is configs/t5-small.json (vocabulary 32128, dropout 0 as pre_train_t5.py trains it)
with random token ids: FLOPs and time do not depend on which ids they are. Lengths are those of
span corruption at --input_length 512: chunks of 568 raw tokens become 512 encoder inputs and 114
targets (data_collator_t5.compute_input_and_target_lengths), with no padding.

One training step is what pre_train_t5.py runs: t5_training.step.train_step (forward_loss_sum,
backward, gradient clipping, the project's AdamW step, t5_training.optim.build_optimizer with
--optim adamw_torch) under the project's Accelerator (runtime.build_accelerator: fp32 on a CPU,
bf16 autocast on a GPU that has it).

Model FLOPs per step, counted analytically (B sequences, S = 512 source and T = 114 target
tokens, d = d_model, i = num_heads * d_kv, f = d_ff, V = vocabulary, Le / Ld encoder / decoder
layers). A matmul of (m x k) @ (k x n) costs 2mkn forward and twice that backward (gradients
of both operands), so every term below is counted 3 times per step:

    linear layers   2 * B * ( Le * S * (4di + 2df)              encoder self-attention q k v o, feed-forward
                            + Ld * T * (4di + 2di + 2df)        decoder self-attention, cross-attention q o, FF
                            + Ld * S * 2di                      cross-attention k v, over the encoder output
                            + T * d * V )                       LM head
    attention       2 * 2 * B * i * ( Le * S*S + Ld * (T*T + T*S) )   scores Q K^T and weights @ V

(a gated feed-forward, T5 v1.1, has 3df instead of 2df). The decoder's causal self-attention is
counted over the full T x T square, as the kernels compute it. Excluded: layer norms, softmax,
ReLU, residual adds, the relative position bias, embedding lookups, the loss, and the optimizer
update (about 15 FLOPs per parameter, under 1% of a step at batch 1). The script cross-checks
the count against torch.utils.flop_counter.FlopCounterMode on one forward and one forward +
backward of the same model (it counts mm/bmm/sdpa; the CPU flash-attention kernel that
PyTorch's SDPA picks for cross-attention is not in its table, so its formula is registered here).
The forward counts agree exactly; the counter's step is higher by half the cross-attention
forward (+0.3% for t5-small), because that kernel's backward recomputes the attention scores:
FLOPs the hardware does but the model does not need, which MFU leaves out.

Time per step: the median (and best) over --steps steps after --warmup steps, with
torch.set_num_threads at the machine's cores. Peak: the best FLOP/s of large torch.mm in the same
dtype, timed in the same run, before and after the steps (a 2048 x 2048 square, 8192 on a GPU,
and the step's own (B*S x d) @ (d x f) feed-forward shapes). MFU = model FLOPs per step / step time / peak.
On a CPU shared with other work both figures are noisy, so a second MFU is reported by busy
time: the process's CPU time over its threads, for the steps and for the peak alike, which
leaves out the time other processes held the cores. With --threads 1 it is exact; with more
threads it flatters a little, since serial stretches (Python, small ops) keep one thread busy.
Then torch.profiler records one step and the table lists the top ops by self time. Last,
steps of the project's setup alternate with cheap alternatives (torch's unfused AdamW, Adafactor
stepping its tensors together and one at a time, eager instead of SDPA attention, fused RMS norms,
T5 v1.1's GELU unfused) at one batch size, to show what each would gain or cost.
On a machine shared with other work, OMP_WAIT_POLICY=PASSIVE keeps idle OpenMP threads from
spinning against each other and makes the timings far steadier.

Prints a table and writes --output (JSON).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import REPO  # noqa: E402
from _flops import analytic_flops, check_flops  # noqa: E402
from _step_timing import describe_attention, matmul_peak, profile_step, time_steps  # noqa: E402

import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from t5_training.collators import compute_input_and_target_lengths  # noqa: E402
from t5_training import modeling, reporting, runtime  # noqa: E402
from t5_training.config import TrainingConfig  # noqa: E402
from t5_training.optim import build_optimizer  # noqa: E402

# On a CPU (t5-small, fp32), where matmuls are most of a step: 50%. On a GPU (T5 v1.1-base, bf16):
# 40%, above nanoT5's 34% on an A100 with bf16 and compile; a GPU leaves its elementwise work the step.
GOAL = {"cpu": 0.5, "cuda": 0.4}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths, 2 steps: checks that it runs")
    parser.add_argument("--model_config", default=None, help="default: configs/t5-small.json (quick: t5-tiny.json)")
    parser.add_argument("--input_length", type=int, default=None, help="encoder tokens (default 512; quick: 128)")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=None, help="default: 1 2 4 8 (quick: 1 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per batch size (default 5; quick: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--profile_batch_size", type=int, default=None, help="default: the largest batch size")
    parser.add_argument("--variants_batch_size", type=int, default=None,
                        help="batch of the comparison with other optimizers and attention (default: the smallest)")
    parser.add_argument("--variant_rounds", type=int, default=None,
                        help="interleaved steps per alternative (default 3; quick: 1); 0 skips the comparison")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the CPUs this process has)")
    parser.add_argument("--mixed_precision", default="auto", choices=["auto", "no", "bf16"],
                        help="as --mixed_precision of the scripts: auto is bf16 on a GPU that has it, else fp32")
    parser.add_argument("--torch_compile", action="store_true",
                        help="compile the model as pre_train_t5.py --torch_compile does (a static graph per batch "
                             "size; the warm-up steps, at least 2, include the compile)")
    parser.add_argument("--torch_compile_mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
    parser.add_argument("--output", default=None, help="results JSON (default: runs/pretraining_mfu[_quick].json)")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"model_config": os.path.join(REPO, "configs", "t5-tiny.json" if quick else "t5-small.json"),
                "input_length": 128 if quick else 512, "batch_sizes": [1, 2] if quick else [1, 2, 4, 8],
                "steps": 2 if quick else 5, "variant_rounds": 1 if quick else 3,
                "threads": len(os.sched_getaffinity(0)),
                "output": os.path.join(REPO, "runs", "pretraining_mfu" + ("_quick" if quick else "") + ".json")}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.torch_compile:
        args.warmup = max(args.warmup, 2)  # the first compiles forward and backward; the second runs them
    args.profile_batch_size = args.profile_batch_size or max(args.batch_sizes)
    args.variants_batch_size = args.variants_batch_size or min(args.batch_sizes)
    return args


# --- the run -----------------------------------------------------------------------------------

def random_batch(batch_size: int, source: int, target: int, vocab_size: int, device, seed: int = 0) -> dict:
    """A span-corruption-shaped batch of random ids (no padding, as the packed corpus gives)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, vocab_size, (batch_size, target), generator=generator)
    batch = {"input_ids": torch.randint(2, vocab_size, (batch_size, source), generator=generator),
             "attention_mask": torch.ones(batch_size, source, dtype=torch.long),
             "labels": labels,
             "decoder_input_ids": torch.cat([torch.zeros(batch_size, 1, dtype=torch.long), labels[:, :-1]], dim=1)}
    return {name: value.to(device) for name, value in batch.items()}


def fuse_norms(model) -> None:
    """T5's RMS norms as one fused kernel each (F.rms_norm), the same formula that transformers
    writes as six elementwise ops, each a pass over the activations: what eager mode loses to them
    on a GPU, which compiling also fuses away. (The gated GELU is fused in every side, as
    load_model does for the scripts.)"""
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    def rms_norm(self, hidden):
        normed = torch.nn.functional.rms_norm(hidden.float(), hidden.shape[-1:], eps=self.variance_epsilon)
        return self.weight * (normed.to(self.weight.dtype) if self.weight.dtype in (torch.float16, torch.bfloat16)
                              else normed)

    for module in model.modules():
        if isinstance(module, T5LayerNorm):
            module.forward = rms_norm.__get__(module)


def build(config, run_config, accelerator, attention: str | None = None, optim: str | None = None,
          fused: bool = False, gelu_as_written: bool = False):
    """A freshly initialised model (seed 0) and its optimizer, prepared by `accelerator`.

    By default both are what pre_train_t5.py builds (`--optim adamw_torch`: fused AdamW);
    `optim` picks another of the project's optimizers, "adamw_unfused" for torch's plain AdamW, or
    "adafactor_foreach" / "adafactor_per_tensor" for T5's Adafactor stepping its tensors together
    (a GPU's default) or one at a time (a CPU's); `fused`, fuse_norms; `gelu_as_written`, T5 v1.1's
    gelu_new as transformers writes it (eight elementwise ops) instead of modeling.fuse_gelu's kernel.
    """
    torch.manual_seed(0)
    # As load_model builds it for the scripts; fresh_model copies `config`, which every side shares.
    model = modeling.fresh_model(config, **({"attn_implementation": attention} if attention else {}))
    model.train()
    if gelu_as_written:
        modeling.unfuse_gelu(model)
    if fused:
        fuse_norms(model)
    if optim == "adamw_unfused":
        optimizer = build_optimizer(model, run_config)
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups, lr=run_config.resolved_learning_rate)
    elif optim in ("adafactor_foreach", "adafactor_per_tensor"):
        optimizer = build_optimizer(model, dataclasses.replace(run_config, optim="adafactor"))
        for group in optimizer.param_groups:
            group["foreach"] = optim == "adafactor_foreach"
    else:
        optimizer = build_optimizer(model, dataclasses.replace(run_config, optim=optim) if optim else run_config)
    return accelerator.prepare(model, optimizer)


def measure_batch_sizes(args, accelerator, model, optimizer, config, source: int, target: int) -> list[dict]:
    per_batch = []
    for batch_size in args.batch_sizes:
        if args.torch_compile:
            # A pretraining run has one batch size: a static graph for it, not a symbolic one
            # (which a second size would make without the reset).
            torch._dynamo.reset()
        batch = random_batch(batch_size, source, target, config.vocab_size, accelerator.device)
        times, busy = time_steps(accelerator, model, optimizer, batch, args.warmup, args.steps)
        per_batch.append({"batch_size": batch_size,
                          "model_flops_per_step": analytic_flops(config, batch_size, source, target)["train_step"],
                          "step_seconds": times, "step_seconds_median": statistics.median(times),
                          "step_seconds_best": min(times), "step_busy_seconds": busy,
                          "step_busy_seconds_median": statistics.median(busy)})
        print(f"  batch {batch_size}: {statistics.median(times):.3f} s/step median, {min(times):.3f} s best",
              flush=True)
    return per_batch


def add_utilisation(per_batch: list[dict], peak: float, busy_peak: float, tokens_per_sequence: int) -> None:
    for entry in per_batch:
        entry["model_flops_per_second"] = entry["model_flops_per_step"] / entry["step_seconds_median"]
        entry["mfu"] = entry["model_flops_per_second"] / peak
        entry["mfu_best_step"] = entry["model_flops_per_step"] / entry["step_seconds_best"] / peak
        entry["mfu_busy_time"] = entry["model_flops_per_step"] / entry["step_busy_seconds_median"] / busy_peak
        entry["tokens_per_second"] = entry["batch_size"] * tokens_per_sequence / entry["step_seconds_median"]


def compare_variants(args, accelerator, baseline: tuple, config, run_config, source: int, target: int) -> dict:
    """Steps of the project's setup against cheap alternatives, interleaved round by round (same batch)."""
    sides = {"project: fused AdamW, SDPA attention": baseline,
             "AdamW not fused (torch's default)": build(config, run_config, accelerator, optim="adamw_unfused"),
             "Adafactor (pre_train_t5.py's default), multi-tensor": build(config, run_config, accelerator,
                                                                         optim="adafactor_foreach"),
             "Adafactor, one tensor at a time": build(config, run_config, accelerator, optim="adafactor_per_tensor"),
             "eager attention": build(config, run_config, accelerator, attention="eager"),
             "fused RMS norms": build(config, run_config, accelerator, fused=True)}
    if config.is_gated_act:
        sides["GELU as transformers writes it"] = build(config, run_config, accelerator, gelu_as_written=True)
    batch = random_batch(args.variants_batch_size, source, target, config.vocab_size, accelerator.device)
    for model, optimizer in sides.values():
        time_steps(accelerator, model, optimizer, batch, args.warmup, 0)
    seconds = {name: ([], []) for name in sides}
    for _ in range(args.variant_rounds):
        for name, (model, optimizer) in sides.items():
            for kept, new in zip(seconds[name], time_steps(accelerator, model, optimizer, batch, 0, 1)):
                kept += new
    reference = statistics.median(next(iter(seconds.values()))[0])
    return {"batch_size": args.variants_batch_size,
            "sides": {name: {"step_seconds": wall, "step_seconds_median": statistics.median(wall),
                             "step_seconds_best": min(wall), "step_busy_seconds_median": statistics.median(busy),
                             "speedup_vs_project": reference / statistics.median(wall)}
                      for name, (wall, busy) in seconds.items()}}


def print_report(per_batch: list[dict], peak: float, peak_by_shape: dict, busy_peak: float, profile: dict,
                 variants: dict, goal: float) -> None:
    rows = [{"batch": e["batch_size"], "GFLOP/step": round(e["model_flops_per_step"] / 1e9, 1),
             "s/step (median)": round(e["step_seconds_median"], 3), "s/step (best)": round(e["step_seconds_best"], 3),
             "tokens/s": round(e["tokens_per_second"]), "GFLOP/s": round(e["model_flops_per_second"] / 1e9, 1),
             "MFU": f"{100 * e['mfu']:.1f}%", "MFU (best step)": f"{100 * e['mfu_best_step']:.1f}%",
             "MFU (busy time)": f"{100 * e['mfu_busy_time']:.1f}%"} for e in per_batch]
    print()
    print(reporting.format_table(rows))
    shapes = ", ".join(f"{name} {flops / 1e9:.1f}" for name, flops in peak_by_shape.items())
    print(f"\npeak matmul {peak / 1e9:.1f} GFLOP/s ({shapes})"
          f"; by busy time {busy_peak / 1e9:.1f} GFLOP/s; goal MFU >= {goal:.0%}")
    print(f"\nprofile of one step at batch {profile['batch_size']}: {100 * profile['matmul_share']:.1f}% of "
          f"{profile['clock']} self time in matmul kernels, {100 * profile['optimizer_share']:.1f}% in the optimizer "
          "step; top ops:")
    print(reporting.format_table([{"op": o["op"], "self ms": o["self_ms"], "share": f"{100 * o['share']:.1f}%",
                                   "calls": o["calls"]} for o in profile["top_ops"]]))
    print(f"attention ran as: {describe_attention(profile['attention_ops'])}")
    if variants:
        print(f"\nalternatives, interleaved, batch {variants['batch_size']}:")
        print(reporting.format_table([{"setup": name, "s/step (median)": round(v["step_seconds_median"], 3),
                                       "s/step (best)": round(v["step_seconds_best"], 3),
                                       "speedup": f"{v['speedup_vs_project']:.2f}x"}
                                      for name, v in variants["sides"].items()]))


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    raw_length, target = compute_input_and_target_lengths(args.input_length, 0.15, 3.0)
    source = args.input_length
    run_config = TrainingConfig(output_dir=os.path.join(REPO, "runs", "pretraining_mfu_run"), optim="adamw_torch",
                                learning_rate=1e-4, mixed_precision=args.mixed_precision,
                                torch_compile=args.torch_compile, torch_compile_mode=args.torch_compile_mode)
    accelerator = runtime.build_accelerator(run_config, shapes=1)
    precision = runtime.resolve_mixed_precision(args.mixed_precision)
    config = AutoConfig.from_pretrained(args.model_config, dropout_rate=0.0)
    model, optimizer = build(config, run_config, accelerator)
    parameters, attention = model.num_parameters(), model.config._attn_implementation
    print(f"{os.path.relpath(args.model_config, REPO)}: {parameters / 1e6:.1f}M parameters, attention {attention}; "
          f"{raw_length} raw tokens -> {source} inputs, {target} targets; {precision if precision != 'no' else 'fp32'} "
          f"on {accelerator.device} with {args.threads} threads"
          f"{f', compiled ({args.torch_compile_mode})' if args.torch_compile else ''}", flush=True)

    flop_check = check_flops(accelerator.unwrap_model(model, keep_torch_compile=False), config,
                             random_batch(1, source, target, config.vocab_size, accelerator.device))
    print(f"FLOPs per sequence: analytic {flop_check['analytic_forward'] / 1e9:.3f} G forward, "
          f"{flop_check['analytic_train_step'] / 1e9:.3f} G step; FlopCounterMode "
          f"{flop_check['counted_forward'] / 1e9:.3f} G forward, {flop_check['counted_train_step'] / 1e9:.3f} G step "
          f"({100 * flop_check['relative_difference']:+.2f}%)", flush=True)

    # A GPU needs larger matmuls than a CPU to reach its peak.
    square = 512 if args.quick else 8192 if accelerator.device.type == "cuda" else 2048
    shapes = [(square, square, square)] + [(b * source, config.d_model, config.d_ff)
                                           for b in sorted(set(args.batch_sizes))]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    seconds_per_shape = 0.2 if args.quick else 2.0
    peaks = [matmul_peak(shapes, dtype, accelerator.device, seconds_per_shape)]
    per_batch = measure_batch_sizes(args, accelerator, model, optimizer, config, source, target)
    peaks.append(matmul_peak(shapes, dtype, accelerator.device, seconds_per_shape))  # before and after: the best
    peak_by_shape = {name: max(p["wall"][name] for p in peaks) for name in peaks[0]["wall"]}
    busy_peak_by_shape = {name: max(p["busy"][name] for p in peaks) for name in peaks[0]["busy"]}
    peak, busy_peak = max(peak_by_shape.values()), max(busy_peak_by_shape.values())
    add_utilisation(per_batch, peak, busy_peak, source + target)

    batch = random_batch(args.profile_batch_size, source, target, config.vocab_size, accelerator.device)
    profile = {"batch_size": args.profile_batch_size, **profile_step(accelerator, model, optimizer, batch)}
    variants = (compare_variants(args, accelerator, (model, optimizer), config, run_config, source, target)
                if args.variant_rounds else {})
    goal = GOAL.get(accelerator.device.type, GOAL["cpu"])
    print_report(per_batch, peak, peak_by_shape, busy_peak, profile, variants, goal)

    results = {"model_config": os.path.relpath(args.model_config, REPO), "quick": args.quick,
               "parameters": parameters, "attention_implementation": attention, "precision": precision,
               "device": str(accelerator.device), "threads": args.threads, "torch_version": torch.__version__,
               "torch_compile": args.torch_compile, "torch_compile_mode": args.torch_compile_mode,
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "raw_length": raw_length,
               "source_length": source, "target_length": target, "warmup_steps": args.warmup,
               "timed_steps": args.steps, "flop_check": flop_check, "peak_flops_per_second": peak,
               "peak_by_shape": peak_by_shape, "busy_peak_flops_per_second": busy_peak,
               "busy_peak_by_shape": busy_peak_by_shape, "batch_sizes": per_batch, "profile": profile,
               "variants": variants, "goal_mfu": goal}
    reporting.write_json(args.output, results)
    print(f"\nwrote {args.output}")
    return results


if __name__ == "__main__":
    main()
