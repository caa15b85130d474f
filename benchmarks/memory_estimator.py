"""The memory estimator (`python -m t5_training.memory`) against memory measured in real training steps.

Each configuration runs in a fresh Python process, so that no run inherits another's memory:

1. warm up: one training step of a micro T5 with the same options, so that one-off library state
   (kernel code pages, oneDNN and thread-pool buffers, the autograd engine) exists before the
   baseline and is not counted;
2. baseline: collect garbage, give freed heap back to the system (malloc_trim), lock the pages
   resident so far (mlockall, MCL_ONFAULT: reclaim under memory pressure cannot lower RSS in the
   middle of a run), reset the kernel's peak-RSS counter (`echo 5 > /proc/self/clear_refs`) and
   read the resident set size;
3. build the model as the scripts do (`t5_training.modeling.fresh_model`) and the optimizer as
   `t5_training.optim.build_optimizer` does, then run `--steps` full steps on one synthetic batch:
   forward under the run's precision, the fp32 cross entropy of `losses.token_cross_entropy_sum`,
   backward, gradient clipping, optimizer.step(), zero_grad(set_to_none=True);
4. measured = the highest peak RSS of a step (VmHWM, read and reset after each step: exact, the
   kernel tracks it, so no sampling can miss a spike) minus the baseline. The JSON keeps each
   step's peak: the first is lower, its backward ran before the optimizer state existed.

glibc keeps freed memory for reuse and its mmap threshold rises as large blocks are freed, so RSS
would stay at its high-water mark and mix freed memory into the peak. The measuring process runs
with MALLOC_MMAP_THRESHOLD_=65536 (a fixed threshold: every tensor over 64 KiB is its own mmap,
returned on free), MALLOC_ARENA_MAX=2 and MKL_DISABLE_FAST_MM=1 (MKL's buffer cache off), so RSS
follows live tensors. With CUDA (`--device cuda`), it measures torch.cuda.max_memory_allocated()
over the same steps instead, from memory_allocated() before the model exists, all configurations
in the one process; it also keeps the peak of the bytes the tensors requested (before the caching
allocator rounds blocks up). On either device the JSON has what autograd saved for backward in
one more step, storage by storage ("saved"; the "saved MiB" column): where measured and predicted
part, it names the tensors a device keeps that the estimate does not model.

Run from the repository root (about 12 minutes on 2 CPU cores, Linux; `--quick`: one tiny configuration,
a few seconds, which checks that the script works, not its figures):

    python benchmarks/memory_estimator.py --output runs/memory_estimator.json
    python benchmarks/memory_estimator.py --quick
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import REPO, child_main, rss_kib, run_child  # noqa: E402
from _step_timing import attention_ops, describe_attention  # noqa: E402
MIB = 1 << 20
SMALL, TINY, V11_SMALL = "configs/t5-small.json", "configs/t5-tiny.json", "configs/t5-v1_1-small.json"
BASE = "configs/t5-base.json"

# (config, batch, source, target, optim, options); options: gradient_checkpointing, frozen, dropout_rate,
# padding (False: packed pretraining batches), precision.
FULL = [
    (TINY, 32, 128, 8, "adamw_torch", {}),
    (TINY, 32, 128, 8, "adafactor", {}),
    (TINY, 16, 512, 114, "adamw_torch", {}),
    (TINY, 16, 512, 114, "adamw_torch", {"gradient_checkpointing": True}),
    (SMALL, 32, 128, 8, "adamw_torch", {}),
    (SMALL, 32, 128, 8, "adafactor", {"frozen": ["embeddings"]}),
    (SMALL, 8, 512, 114, "adamw_torch", {}),
    (SMALL, 8, 512, 114, "adafactor", {}),
    (SMALL, 8, 512, 114, "adamw_torch", {"gradient_checkpointing": True}),
    (SMALL, 8, 512, 114, "adafactor", {"frozen": ["encoder"]}),
    (SMALL, 8, 512, 114, "adamw_scale", {"dropout_rate": 0.0, "padding": False}),
    (V11_SMALL, 8, 512, 114, "adafactor", {"padding": False}),
    (TINY, 16, 512, 114, "adamw_torch", {"precision": "bf16"}),  # CPU autocast (slow on CPUs without bf16)
    # Adapters (--peft): the base frozen, the adapter alone trained. LoRA on q,v and on all six.
    (SMALL, 8, 512, 114, "adamw_torch", {"peft": "lora", "lora_target_modules": "q,v"}),
    (SMALL, 8, 512, 114, "adamw_torch", {"peft": "lora", "lora_target_modules": "q,k,v,o,wi,wo",
                                         "lora_dropout": 0.1}),
    (SMALL, 8, 512, 114, "adamw_torch", {"peft": "ia3"}),
    (SMALL, 8, 512, 114, "adamw_torch", {"peft": "prompt_tuning"}),
]
ADAPTER_FLAGS = ("peft", "lora_target_modules", "lora_dropout")
QUICK = [(TINY, 16, 128, 8, "adamw_torch", {})]
# On a GPU (--device cuda): t5-small and t5-base shapes in fp32 and bf16 autocast, with the fused
# AdamW and T5's Adafactor that optim.py builds, against torch.cuda.max_memory_allocated().
CUDA = [(shape, 8, 512, 114, optim, {"precision": precision})
        for shape in (SMALL, BASE) for precision in ("fp32", "bf16") for optim in ("adamw_torch", "adafactor")]
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2", "MKL_DISABLE_FAST_MM": "1",
             "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one tiny configuration (CI)")
    parser.add_argument("--steps", type=int, default=2, help="training steps measured per configuration")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--output", default=os.path.join("runs", "memory_estimator.json"))
    parser.add_argument("--match", default=None, help="only the configurations whose options contain this text "
                                                      "or set this option, e.g. peft or lora")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # JSON job of a measuring process
    return parser.parse_args(argv)


# --- the measuring process ----------------------------------------------------------------------

def _reset_peak_rss() -> int:
    """Resets the kernel's peak-RSS counter (Linux) and returns the current RSS in bytes."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass  # a sandbox that forbids it: VmHWM stays the peak since start, an upper bound
    return rss_kib("VmRSS") * 1024


def _lock_resident_pages() -> None:
    """mlockall(MCL_CURRENT | MCL_ONFAULT): pages of the libraries read in so far stay resident, so
    that the kernel reclaiming them under memory pressure cannot lower RSS in the middle of a run.
    Best effort: without the privilege, RSS is only noisier."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mlockall(1 | 4)


def _batch(job: dict, vocab: int, device: str) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    batch, source, target = job["batch"], job["source"], job["target"]
    mask = torch.ones(batch, source, dtype=torch.long)
    if job.get("padding", True):
        for row in range(1, batch, 2):  # every other row shorter, as padded fine-tuning batches are
            mask[row, source - source * row // (2 * batch) - 1:] = 0
    values = {"input_ids": torch.randint(2, vocab, (batch, source), generator=g), "attention_mask": mask,
              "decoder_input_ids": torch.randint(2, vocab, (batch, target), generator=g),
              "labels": torch.randint(2, vocab, (batch, target), generator=g)}
    return {name: value.to(device) for name, value in values.items()}


class SavedTensors:
    """What autograd saves for backward in a step, storage by storage (parameters left out):
    the measured side of the estimate's activations, for finding which tensors a device keeps that
    the estimate does not model. Records shapes and sizes only; it holds no tensor."""

    def __init__(self, model):
        # By storage: a linear layer saves its weight as a transposed view, which is no leaf.
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, tuple[int, tuple, str]] = {}
        self.steps: list[dict] = []

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        if tensor.dim() and storage.data_ptr() not in self.parameters:  # scalars aside, as the tracer
            self.storages.setdefault(storage.data_ptr(), (storage.nbytes(), tuple(tensor.shape), str(tensor.dtype)))
        return tensor

    def end_step(self) -> None:
        """Closes a step's record: its total and its largest storages, by shape and dtype."""
        by_kind: dict[str, list[int]] = {}
        for nbytes, shape, dtype in self.storages.values():
            by_kind.setdefault(f"{list(shape)} {dtype}", []).append(nbytes)
        largest = sorted(by_kind.items(), key=lambda item: -sum(item[1]))[:12]
        self.steps.append({"bytes": sum(n for n, _, _ in self.storages.values()), "storages": len(self.storages),
                           "largest": [{"tensor": kind, "count": len(sizes), "bytes": sum(sizes)}
                                       for kind, sizes in largest]})
        self.storages = {}


def _train(model_config, job: dict, steps: int, device: str, after_step=lambda: None, census: bool = False) -> dict:
    """Builds the model and optimizer and runs `steps` training steps, as the training loop does;
    with `census`, one more step records what autograd saves (SavedTensors), which it returns."""
    import torch

    from t5_training import adapters, losses, modeling, optim
    from t5_training.config import TrainingConfig
    from t5_training.tools import memory

    batch = _batch(job, model_config.vocab_size, device)
    model = modeling.fresh_model(model_config)  # as load_model builds it for the scripts
    model = adapters.apply(model, _adapter_config(job)).to(device)
    for name, param in model.named_parameters():
        if memory.part_of(name) in job.get("frozen", []):
            param.requires_grad_(False)
    if job.get("gradient_checkpointing"):
        modeling.enable_activation_checkpointing(model)  # as the scripts do
    model.train()
    optimizer = optim.build_optimizer(model, TrainingConfig(output_dir="unused", max_steps=1, optim=job["optim"]))
    precision = job.get("precision", "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    # The census's step comes after the measured ones: its hooks could change when backward frees
    # what it saved, so no measured step runs under them.
    saved = SavedTensors(model)
    hooks = torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)
    # The profiler names which of SDPA's kernels ran (its math path decomposes below autograd, where
    # only a profiler still sees it): that decides what attention saves.
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for number in range(steps + census):
        recording = number == steps
        with hooks if recording else contextlib.nullcontext(), profiler if recording else contextlib.nullcontext():
            with torch.autocast(device, dtype=dtype, enabled=dtype is not None):  # what accelerate wraps
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               decoder_input_ids=batch["decoder_input_ids"]).logits
            loss = losses.token_cross_entropy_sum(logits, batch["labels"])
        del logits
        if recording:
            saved.end_step()
        (loss / batch["labels"].numel()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not recording:
            after_step()
    return {**saved.steps[-1], "attention_ops": attention_ops(profiler)} if census else {}



def _adapter_config(job: dict):
    from t5_training.adapters import AdapterConfig

    return AdapterConfig(**{flag: job[flag] for flag in ADAPTER_FLAGS if flag in job})


def measure(job: dict) -> dict:
    """Runs in a fresh process: the estimate, and the memory one configuration really takes."""
    import ctypes
    import gc
    import warnings

    import torch
    import transformers

    from t5_training import adapters
    from t5_training.tools import adapter_memory, memory

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    device = job["device"]
    model_config = memory.load_model_config(os.path.join(REPO, job["config"]), job.get("dropout_rate"))
    micro = transformers.T5Config(vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1,
                                  dropout_rate=model_config.dropout_rate,
                                  feed_forward_proj=model_config.feed_forward_proj)
    _train(micro, {**job, "batch": 2, "source": 16, "target": 4}, 2, device)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        baseline_requested = torch.cuda.memory_stats().get("requested_bytes.all.current", 0)
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        _lock_resident_pages()
        baseline = _reset_peak_rss()
    file_pages = rss_kib("RssFile") if device == "cpu" else 0
    peaks, requested = [], []

    def after_step():  # each step's own peak: the first has no optimizer state during backward
        if device == "cuda":
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - baseline)
            # What the tensors asked for, before the caching allocator rounds each block up.
            requested.append(torch.cuda.memory_stats().get("requested_bytes.all.peak", 0) - baseline_requested)
            torch.cuda.reset_peak_memory_stats()
        else:
            peaks.append(rss_kib("VmHWM") * 1024 - baseline)
            _reset_peak_rss()

    start = time.perf_counter()
    saved = _train(model_config, job, job["steps"], device, after_step, census=True)
    seconds = time.perf_counter() - start
    result = memory.estimate(model_config, batch_size=job["batch"], source_length=job["source"],
                             target_length=job["target"], precision=job.get("precision", "fp32"),
                             optim=job["optim"], gradient_checkpointing=job.get("gradient_checkpointing", False),
                             frozen=job.get("frozen", ()), device=device, padding=job.get("padding", True),
                             adapter=adapter_memory.describe(model_config, _adapter_config(job))
                             if adapters.in_use(_adapter_config(job)) else None)
    return {"measured": max(peaks), "step_peaks": peaks, "requested_peaks": requested, "saved": saved,
            "seconds": seconds, "estimate": result.to_dict(),
            # Library pages read in (or dropped) during the run would count in RSS: should stay near 0.
            "file_pages_change": (rss_kib("RssFile") - file_pages) * 1024 if device == "cpu" else 0}


# --- the table ----------------------------------------------------------------------------------

def _options(options: dict) -> str:
    words = []
    if options.get("gradient_checkpointing"):
        words.append("grad ckpt")
    words += [f"freeze {part}" for part in options.get("frozen", [])]
    if "dropout_rate" in options:
        words.append(f"dropout {options['dropout_rate']:g}")
    if options.get("padding") is False:
        words.append("packed")
    if options.get("precision", "fp32") != "fp32":
        words.append(f"{options['precision']} autocast")
    if "peft" in options:
        words.append(" ".join([options["peft"]] + [f"{options[flag]}" for flag in ADAPTER_FLAGS[1:] if flag in options]))
    return ", ".join(words) or "-"


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, measure)
        return []
    from t5_training.reporting import format_table, write_json

    rows = []
    configurations = QUICK if args.quick else (CUDA if args.device == "cuda" else FULL)
    for config, batch, source, target, optim, options in configurations:
        if args.match and args.match not in _options(options) and args.match not in options:
            continue
        job = {"config": config, "batch": batch, "source": source, "target": target, "optim": optim,
               "steps": args.steps, "device": args.device, **options}
        # On a GPU in this process, one configuration after another: max_memory_allocated counts
        # live tensors exactly, so none inherits another's, and a process each would spend most of
        # the GPU check's minutes starting Python and CUDA. On the CPU, RSS needs a fresh process.
        result = (measure(job) if args.device == "cuda" else
                  run_child(__file__, {**job, "name": f"configuration-{len(rows) + 1}"}, env=CHILD_ENV))
        predicted, measured = result["estimate"]["total"], result["measured"]
        rows.append({"config": os.path.basename(config).removesuffix(".json"), "batch": batch,
                     "lengths": f"{source}->{target}", "optim": optim, "options": _options(options),
                     "predicted MiB": round(predicted / MIB, 1), "measured MiB": round(measured / MIB, 1),
                     "error %": round(100 * (predicted - measured) / measured, 1),
                     "peak at": result["estimate"]["peak_at"], "seconds": round(result["seconds"], 1),
                     "saved MiB": round(result["saved"]["bytes"] / MIB, 1),
                     "traced saved MiB": round(result["estimate"]["saved_for_backward"] / MIB, 1),
                     "job": job, "estimate": result["estimate"], "measured_bytes": measured,
                     "step_peaks": result["step_peaks"], "requested_peaks": result["requested_peaks"],
                     "saved": result["saved"], "file_pages_change": result["file_pages_change"]})
        print(f"  done: {format_table([_shown(rows[-1])]).splitlines()[-1]}", flush=True)
    print()
    print(format_table([_shown(row) for row in rows]))
    within = sum(abs(row["error %"]) <= 15 for row in rows)
    print(f"\n{within} of {len(rows)} within 15% of measured ({args.device}, {args.steps} steps each)")
    for kernels in sorted({describe_attention(row["saved"]["attention_ops"]) for row in rows}):
        print(f"attention ran as: {kernels}")
    if args.output:
        write_json(args.output, {"device": args.device, "steps": args.steps, "rows": rows})
    return rows


def _shown(row: dict) -> dict:
    return {key: value for key, value in row.items() if not isinstance(value, (dict, list)) and key not in
            ("measured_bytes", "file_pages_change")}


if __name__ == "__main__":
    main()
