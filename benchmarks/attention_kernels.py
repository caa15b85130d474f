"""T5's self-attention on a GPU: which SDPA kernel a trained position bias gets, why, and what a
fused kernel that still returns the bias's gradient would gain.

    python benchmarks/attention_kernels.py --device cuda   # T5 v1.1-base's shapes in bf16: batch 64, 12 heads, 512 x 64
    python benchmarks/attention_kernels.py --quick         # tiny shapes on the CPU: checks that it runs, not its speed

T5 adds its relative position bias to the attention scores as SDPA's float mask (transformers:
position bias + padding mask, one contiguous batch x heads x L x L tensor), and in training the
bias learns, so the mask needs a gradient. On an H200 (torch 2.11, 2026-11-28) every such
self-attention ran SDPA's math kernel, in fp32 whatever the inputs' dtype, while cross-attention,
whose mask is constant, ran a fused one (docs/results/performance.md, pretraining MFU on one H200).
This script times forward and backward of one such call, three ways, interleaved round by round:

- "sdpa, bias trained": F.scaled_dot_product_attention as transformers calls it (torch's choice);
- "efficient kernel, bias trained" (CUDA only): torch.ops.aten._scaled_dot_product_efficient_attention
  called directly, whose backward returns the bias's gradient too;
- "sdpa, bias constant": the same call with the mask detached, so no bias gradient: the fused
  kernel torch picks then, a bound on what a trained bias could cost.

It checks the direct call against the math kernel (the largest difference of the output and of
each gradient, relative to the largest value), prints why torch's dispatcher refused each fused
kernel for the trained bias (`torch.backends.cuda.can_use_*(..., debug=True)`'s reasons), and
which aten ops each side ran. Writes --output (JSON).
"""
from __future__ import annotations

import argparse
import statistics
import warnings

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import add_device_argument, use_device  # noqa: E402
from _step_timing import attention_ops, describe_attention, timed  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from t5_training import reporting  # noqa: E402

SIDES = ("sdpa, bias trained", "efficient kernel, bias trained", "sdpa, bias constant")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_argument(parser)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--length", type=int, default=512, help="queries = keys: an encoder's self-attention")
    parser.add_argument("--head_dim", type=int, default=64)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="batch 2, 2 heads, 32 x 8, fp32, 2 rounds")
    parser.add_argument("--output", default="runs/attention_kernels.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.heads, args.length, args.head_dim, args.dtype, args.rounds = 2, 2, 32, 8, "fp32", 2
    return args


def inputs(args, device: torch.device) -> dict:
    """q, k, v and the position bias (1 x heads x L x L, trained, as T5's relative bias expands),
    seeded; the padding mask adds nothing (packed pretraining batches have none)."""
    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    shape = (args.batch_size, args.heads, args.length, args.head_dim)
    made = {name: torch.randn(shape, generator=generator) for name in ("q", "k", "v")}
    made["bias"] = torch.randn((1, args.heads, args.length, args.length), generator=generator)
    made["grad_out"] = torch.randn(shape, generator=generator)
    padding = torch.zeros(args.batch_size, 1, 1, args.length)
    return {"tensors": {name: t.to(device, dtype).requires_grad_(name != "grad_out") for name, t in made.items()},
            "padding": padding.to(device, dtype)}


def trained_mask(made: dict) -> torch.Tensor:
    """Position bias plus padding: batch x heads x L x L, contiguous, as transformers builds it."""
    return made["tensors"]["bias"] + made["padding"]


def attend(side: str, made: dict) -> torch.Tensor:
    """One attention call of T5's (no 1/sqrt(d) scaling) the way `side` runs it."""
    t, mask = made["tensors"], trained_mask(made)
    if side == "sdpa, bias constant":
        mask = mask.detach()
    if side == "efficient kernel, bias trained":
        return torch.ops.aten._scaled_dot_product_efficient_attention(t["q"], t["k"], t["v"], mask, True, 0.0, False,
                                                                      scale=1.0)[0]
    return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=mask, scale=1.0)


def step(side: str, made: dict) -> dict:
    """Forward and backward; the output and the gradients it produced (cleared on the inputs)."""
    t = made["tensors"]
    out = attend(side, made)
    out.backward(t["grad_out"])
    grads = {name: t[name].grad for name in ("q", "k", "v", "bias")}
    for name in grads:
        t[name].grad = None
    return {"out": out.detach(), **grads}


def refusals(made: dict) -> dict[str, list[str]]:
    """Why torch's dispatcher would not run each fused kernel for the trained bias: the warnings
    of its own checks in debug mode (CUDA only; an empty list means the kernel was allowed)."""
    t, mask = made["tensors"], trained_mask(made)
    try:
        params = torch.backends.cuda.SDPAParams(t["q"], t["k"], t["v"], mask, 0.0, False, False)
    except TypeError:  # torch before enable_gqa
        params = torch.backends.cuda.SDPAParams(t["q"], t["k"], t["v"], mask, 0.0, False)
    found = {}
    for kernel in ("flash", "efficient", "cudnn"):
        check = getattr(torch.backends.cuda, f"can_use_{kernel}_attention", None)
        if check is None:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            allowed = check(params, True)
        found[kernel] = [] if allowed else [str(w.message).splitlines()[0] for w in caught] or ["refused"]
    return found


def agreement(reference: dict, other: dict) -> dict[str, float]:
    """Largest absolute difference of each result, over the reference's largest absolute value."""
    return {name: float((other[name].float() - reference[name].float()).abs().max()
                        / reference[name].float().abs().max().clamp_min(1e-30)) for name in reference}


def main(argv=None) -> dict:
    args = parse_args(argv)
    use_device(args.device)
    device = torch.device(args.device)
    made = inputs(args, device)
    sides = [s for s in SIDES if device.type == "cuda" or s != "efficient kernel, bias trained"]
    # One call each before timing (kernel selection, cuBLAS and autotuning), and its profile.
    kernels, results = {}, {}
    for side in sides:
        with torch.profiler.profile() as prof:
            results[side] = step(side, made)
        kernels[side] = describe_attention(attention_ops(prof))
    seconds = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side in sides:
            seconds[side].append(timed(lambda: step(side, made), device)[0])
    reference = statistics.median(seconds[sides[0]])
    report = {"shape": {"batch": args.batch_size, "heads": args.heads, "length": args.length,
                        "head_dim": args.head_dim, "dtype": args.dtype},
              "device": str(device), "torch_version": torch.__version__,
              "refused": refusals(made) if device.type == "cuda" else {},
              "sides": {side: {"kernels": kernels[side], "seconds": seconds[side],
                               "seconds_median": statistics.median(seconds[side]),
                               "speedup": reference / statistics.median(seconds[side])} for side in sides}}
    if "efficient kernel, bias trained" in results:
        report["efficient_vs_sdpa_relative_difference"] = agreement(results[sides[0]],
                                                                    results["efficient kernel, bias trained"])
    print_report(report)
    reporting.write_json(args.output, report)
    print(f"\nwrote {args.output}")
    return report


def print_report(report: dict) -> None:
    shape = report["shape"]
    print(f"self-attention, batch {shape['batch']}, {shape['heads']} heads, {shape['length']} x {shape['head_dim']}, "
          f"{shape['dtype']}, bias trained, forward + backward, on {report['device']} (torch {report['torch_version']})")
    rows = [{"side": side, "ms (median)": round(1000 * s["seconds_median"], 3), "speedup": round(s["speedup"], 2),
             "ran": s["kernels"]} for side, s in report["sides"].items()]
    print(reporting.format_table(rows))
    for kernel, reasons in report["refused"].items():
        print(f"{kernel}: {'allowed' if not reasons else 'refused: ' + '; '.join(reasons)}")
    if "efficient_vs_sdpa_relative_difference" in report:
        print("efficient kernel against sdpa's, largest difference over largest value: "
              + ", ".join(f"{k} {v:.1e}" for k, v in report["efficient_vs_sdpa_relative_difference"].items()))


if __name__ == "__main__":
    main()
