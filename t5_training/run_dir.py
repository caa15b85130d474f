"""The run folder (--output_dir): resuming into it, saving and exporting, results, and the one reader.

A run writes, in its --output_dir:
  step-NNNNNN/train_state.json   per checkpoint: step, data position, per-step losses, evaluations
  best/, final/                  exports that from_pretrained loads
  train_results.json, eval_results.json   written when the run finishes, after final/
and, from other modules, predictions, GLUE's submission files, a mixture's record and a
tensorboard log (RUN_FILES); a run that starts over there deletes all of them first.

Writing: `check_output_dir` and `resume` (before anything is written), `save` (a checkpoint, then
rotation), `export` and `write_results`; `checkpoint` and `export` hold the mechanics of each file. Reading: the sweep runner,
the demo, the benchmarks and the tests read runs through the read_* functions,
so what "finished" and "newest checkpoint" mean is decided here once: only complete
checkpoints count (checkpoint.list_checkpoints), and a run is finished when its export and both
results files exist.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import torch

from t5_training import adapters, agreement, checkpoint, export as exports, reporting, resume as layouts
from t5_training.device import runs_on_cuda
from t5_training.errors import DivergedError, UsageError, WriteError

RESULTS_FILES = {"train": "train_results.json", "eval": "eval_results.json"}
LOSS_CURVE = "loss_curve.png"
# Every name a run writes at the top of --output_dir (checkpoint, evaluation, submission and mixture
# write the ones not defined here), each also as "<name>.tmp" while it is being written: what
# --overwrite_output_dir deletes. Anything else there (a sweep's trial.log, the user's own files) is
# not a run's, and stays.
_NAMED = ("best", "final", *RESULTS_FILES.values(), LOSS_CURVE, "submission", "submission.zip", "mixture_rows.tsv",
          "mixture_rates.json")
RUN_FILES = re.compile(r"(step-\d+|\.tmp-step-\d+|predictions_.+\.tsv|" + "|".join(map(re.escape, _NAMED))
                       + r")(\.tmp)?")
# --report_to tensorboard writes these under output_dir/<--project_name>/ (accelerate's tracker).
TENSORBOARD_FILES = re.compile(r"events\.out\.tfevents\..+|hparams\.yml")
# The flags that name what a run reads: starting over must not delete them first.
INPUT_FLAGS = ("model_name_or_path", "config_name", "tokenizer_name", "train_file", "validation_file", "data_dir",
               "denoisers")


# --- writing -------------------------------------------------------------------------------------

def check_output_dir(config) -> str | None:
    """Checks that the run may write to --output_dir; returns the checkpoint to resume from, if any.

    checkpoint.check_output_dir's rules, and one more: a run that starts over there
    (--overwrite_output_dir) must not read what it will delete, such as its --model_name_or_path
    in the earlier run's final/. Runs on every process and writes nothing.
    """
    resume = checkpoint.check_output_dir(config.output_dir, config.overwrite_output_dir, config.resume_from_checkpoint)
    if resume or not config.overwrite_output_dir:
        return resume
    earlier = earlier_run(config.output_dir)
    for name in INPUT_FLAGS:
        value = getattr(config, name, None)
        for path in value if isinstance(value, (list, tuple)) else [value]:
            inside = next((old for old in earlier if path and _within(path, old)), None)
            if inside:
                raise UsageError(f"--{name} {path} lies in {inside}, which --overwrite_output_dir deletes before this "
                                 f"run starts: copy it out of --output_dir {config.output_dir} first, or choose "
                                 "another --output_dir")
    return None


def earlier_run(output_dir: str) -> list[str]:
    """What an earlier run wrote at the top of `output_dir` (RUN_FILES and a tensorboard log), as paths."""
    if not os.path.isdir(output_dir):
        return []
    return [os.path.join(output_dir, name) for name in sorted(os.listdir(output_dir))
            if RUN_FILES.fullmatch(name) or _is_tensorboard_log(os.path.join(output_dir, name))]


def _is_tensorboard_log(path: str) -> bool:
    # Only a folder that holds the tracker's files and nothing else: never a user's folder.
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    names = [name for _, _, files in os.walk(path) for name in files]
    return bool(names) and all(TENSORBOARD_FILES.fullmatch(name) for name in names)


def _within(path: str, folder: str) -> bool:
    # Through links too: a model reached by a link into the folder is deleted all the same.
    return any(p == f or p.startswith(f + os.sep) for p, f in ((os.path.abspath(path), os.path.abspath(folder)),
                                                               (os.path.realpath(path), os.path.realpath(folder))))


def start_output_dir(accelerator, config, resuming: bool) -> None:
    """Creates --output_dir; a run starting over there (--overwrite_output_dir) first deletes the earlier run.

    Left in place, its checkpoints would be taken for this run's by 'auto' and by rotation, and
    its exports, results, predictions and submission files would make the folder read as a run
    this one is not. Called once every input has been checked, so a refused run deletes nothing.
    Only the main process deletes; the others wait. A link is removed, never followed.
    """
    def start() -> None:
        if not accelerator.is_main_process:
            return
        earlier = earlier_run(config.output_dir) if config.overwrite_output_dir and not resuming else []
        try:
            os.makedirs(config.output_dir, exist_ok=True)
            for path in earlier:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
        except OSError as err:
            raise WriteError(f"could not create or clear --output_dir {config.output_dir} ({err.strerror}: "
                             f"{err.filename}); fix its permissions, or choose another --output_dir") from None

    agreement.on_every_process(accelerator, start)


def resume(accelerator, config, path: str | None, state, scheduler, *, streaming: bool = False, check=None):
    """Loads checkpoint `path` (if any) into `state` and the scheduler, then opens the output folder.

    Loading comes before the folder is touched: a checkpoint refused here leaves no trace. Each
    process reads its own RNG file, so a damaged one fails on that process alone, and all agree.
    `streaming` runs refuse another number of processes (resume.continue_with_layout); `check(state,
    path)` refuses whatever else the caller knows cannot continue (a mixture that changed).
    """
    if path:
        agreement.on_every_process(accelerator, lambda: checkpoint.load_checkpoint(
            accelerator, path, state, scheduler, trainable_only=adapters.in_use(config)))
        layouts.continue_with_layout(accelerator, config, state, path, streaming=streaming)
        if check:
            check(state, path)
        accelerator.print(f"resumed from {path} at step {state.step}")
    start_output_dir(accelerator, config, resuming=bool(path))
    return state


def save(accelerator, config, model, scheduler, state) -> str:
    """Checkpoints the run (never with non-finite weights) and rotates old checkpoints; returns the folder."""
    ensure_finite_weights(model, f"step {state.step}")
    path = checkpoint.save_checkpoint(accelerator, config.output_dir, state, scheduler,
                                      trainable_only=adapters.in_use(config))
    if accelerator.is_main_process:
        checkpoint.rotate_checkpoints(config.output_dir, config.save_total_limit, keep_step=state.best_step)
    accelerator.wait_for_everyone()
    return path


def ensure_finite_weights(model: torch.nn.Module, where: str) -> None:
    """Raises DivergedError instead of letting NaN or inf weights reach a checkpoint or an export."""
    # Under ZeRO-3 a parameter is an empty placeholder and this process's shard is `ds_tensor`.
    shards = [getattr(p, "ds_tensor", p) for p in model.parameters()]
    finite = torch.stack([torch.isfinite(t).all() for t in shards]).all()
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        # Sharded weights (ZeRO-3, FSDP) differ between processes: all must take the same
        # decision, or one would raise while the others wait in the next collective.
        # A GPU run's group is NCCL, which takes GPU tensors only (a ZeRO-offloaded shard sits on
        # the CPU); a CPU run's is gloo, also on a GPU host.
        device = torch.device("cuda", torch.cuda.current_device()) if runs_on_cuda() else "cpu"
        flag = finite.to(device=device, dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        finite = flag.bool()
    if not bool(finite):
        raise DivergedError(f"the weights are not finite at {where}, so they were not saved; the last saved "
                            "checkpoint is intact. Lower --learning_rate, or use --mixed_precision bf16 over fp16")


def exporter(accelerator, tokenizer, output_dir: str):
    """`export(model, name)`: writes output_dir/<name>/ (model and tokenizer, from_pretrained-ready)."""
    def export(model, name: str) -> None:
        exports.export_model(accelerator, model, tokenizer, os.path.join(output_dir, name))

    return export


def export_final(accelerator, model, tokenizer, output_dir: str) -> None:
    """The trained model as output_dir/final/, once its weights are known to be finite."""
    ensure_finite_weights(model, "the end of training")
    exporter(accelerator, tokenizer, output_dir)(model, "final")


def write_results(accelerator, config, state, objective, per_epoch: int) -> dict:
    """Writes train_results.json, eval_results.json and loss_curve.png; prints the metric table.

    Throughput counts time spent in optimizer steps only (not evaluation or saving), and
    tokens are non-padding input plus target tokens over all processes. `per_epoch` is the
    micro-batches per process per epoch (0 for a stream).
    """
    rows_per_epoch = per_epoch * layouts.micro_batch_rows(layouts.batch_layout(config, accelerator.num_processes))
    seconds = max(state.train_seconds, 1e-9)
    train_results = {
        "train_loss": sum(state.losses) / len(state.losses) if state.losses else float("nan"),
        "train_runtime": round(state.train_seconds, 3),
        "train_samples_per_second": round(state.samples_seen / seconds, 3),
        "train_tokens_per_second": round(state.tokens_seen / seconds, 3),
        "train_steps": state.step,
        # Non-padding input + target tokens: how much text the model has seen (over all processes).
        "train_tokens": state.tokens_seen,
        "train_samples": state.samples_seen,
        "epoch": round(state.epoch + state.samples_in_epoch / rows_per_epoch, 4) if rows_per_epoch else None,
    }
    last_eval = {k: v for k, v in (state.evals[-1] if state.evals else {}).items() if k != "step"}
    eval_results = {**last_eval, "best_metric": state.best_metric, "best_step": state.best_step,
                    "metric_to_optimize": objective.metric}
    if accelerator.is_main_process:
        output_dir = config.output_dir
        reporting.write_json(os.path.join(output_dir, RESULTS_FILES["train"]), train_results)
        reporting.write_json(os.path.join(output_dir, RESULTS_FILES["eval"]), eval_results)
        if state.losses:
            reporting.save_loss_curves(os.path.join(output_dir, LOSS_CURVE),
                                       {"training loss": {"train": state.losses}})
        rows = [{"metric": k, "value": v} for k, v in last_eval.items()]
        rows += [{"metric": k, "value": v} for k, v in train_results.items()]
        accelerator.print(reporting.format_table(rows))
    return {"train": train_results, "eval": eval_results}


def write_eval_results(accelerator, output_dir: str, results: dict) -> dict:
    """eval_results.json of a run that only evaluates (--do_train false); prints the metric table."""
    if accelerator.is_main_process:
        reporting.write_json(os.path.join(output_dir, RESULTS_FILES["eval"]), results)
        accelerator.print(reporting.format_table([{"metric": k, "value": v} for k, v in results.items()]))
    return results


# --- reading -------------------------------------------------------------------------------------

def read_state(run_dir: str, step: int | None = None) -> dict | None:
    """The train_state.json of checkpoint `step`, or of the newest complete checkpoint; None if there is none.

    A checkpoint rotated away between listing and reading (a run still going) is skipped for
    the next newest, so a reader polling a live run never fails on it.
    """
    paths = ([checkpoint.checkpoint_dir(run_dir, step)] if step is not None
             else list(reversed(checkpoint.list_checkpoints(run_dir))))
    for path in paths:
        state = _read_json(os.path.join(path, checkpoint.STATE_FILE))
        if state is not None:
            return state
    return None


def read_losses(run_dir: str, step: int | None = None) -> list[float]:
    """The training loss of every optimizer step up to the checkpoint (newest by default)."""
    state = read_state(run_dir, step)
    return list(state["losses"]) if state else []


def read_evals(run_dir: str) -> list[dict]:
    """Every evaluation so far ({"step", metric: value, ...}), from the newest checkpoint."""
    state = read_state(run_dir)
    return list(state.get("evals", [])) if state else []


def read_final_eval(run_dir: str) -> dict | None:
    """eval_results.json, which a run writes as it finishes; None while it runs or if it never finished."""
    return _read_json(os.path.join(run_dir, RESULTS_FILES["eval"]))


def read_results(run_dir: str) -> dict | None:
    """{"train": ..., "eval": ...} of a finished run (its final export and both results files); else None."""
    final = os.path.join(run_dir, "final")
    # A prompt-tuned run's export is its adapter alone (t5_training.adapters).
    if not any(os.path.isfile(os.path.join(final, *name)) for name in
               (("config.json",), (adapters.ADAPTER_DIR, "adapter_config.json"))):
        return None
    results = {key: _read_json(os.path.join(run_dir, name)) for key, name in RESULTS_FILES.items()}
    return results if all(value is not None for value in results.values()) else None


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
