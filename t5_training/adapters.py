"""Parameter-efficient fine-tuning through peft: LoRA, IA3 and prompt tuning (`--peft`).

    accelerate launch fine_tune_t5.py ... --peft lora     # every linear layer, r 8, alpha 64, 5e-4 under AdamW
    accelerate launch fine_tune_t5.py ... --peft lora --use_dora     # DoRA: LoRA with a trained magnitude
    accelerate launch fine_tune_t5.py ... --peft ia3
    accelerate launch fine_tune_t5.py ... --peft prompt_tuning --num_virtual_tokens 20 --prompt_init vocab

`apply` wraps the loaded model in peft's `PeftModelForSeq2SeqLM`, which freezes every base weight;
the optimizer then sees the adapter's parameters only (optim.build_optimizer takes the trainable
ones). Checkpoints hold the trainable weights alone (checkpoint.save_checkpoint's
`trainable_only`), and an export holds the adapter in `<name>/adapter/` (`PeftModel.from_pretrained`
loads it) and, for LoRA and IA3, the merged model in `<name>/` itself, which `from_pretrained`
loads without peft. Prompt tuning cannot be merged: its `<name>/` holds the adapter and tokenizer,
which fine_tune_t5.py --do_train false evaluates on its base (t5_training/adapter_export.py).

peft is imported only when `--peft` is set: it adds about 4 s to every start.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Literal

import torch

from t5_training import adapter_targets
from t5_training.errors import UsageError, first_line

METHODS = ("none", "lora", "ia3", "prompt_tuning")
ADAPTER_DIR = "adapter"
BASE_DIR = "base"
# Set on a model whose adapter sits on randomly initialised weights (see `apply`).
_RANDOM_BASE = "t5_training_random_base"
# What --prompt_init names, in peft's terms. Sampled vocabulary embeddings are the default:
# Lester et al. (2021) found random prompts lag far behind on T5, and peft's own default is random.
_PROMPT_INIT = {"random": "RANDOM", "vocab": "SAMPLE_VOCAB", "text": "TEXT"}
# What an unset --learning_rate means with an adapter under AdamW: each method's rate in the peft
# benchmark (docs/results/peft.md). At AdamW's default, full fine-tuning's 3e-4, LoRA stayed at
# SST-2's majority class on t5-tiny: an adapter trains few weights, from zero or from one.
LEARNING_RATES = {"lora": 5e-4, "dora": 1e-3, "ia3": 1e-1, "prompt_tuning": 3e-1}
# The flags that tune one method alone (--use_dora, LoRA's too, is refused in __post_init__).
METHOD_FLAGS = {"lora": ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"),
                "ia3": ("ia3_target_modules", "ia3_feedforward_modules"),
                "prompt_tuning": ("num_virtual_tokens", "prompt_init", "prompt_init_text")}


@dataclass(frozen=True)
class AdapterConfig:
    """Which adapter fine_tune_t5.py trains instead of the whole model: LoRA on every linear layer at
    alpha / r = 8 by default, IA3 and prompt tuning with peft's defaults for T5."""

    peft: Literal[METHODS] = field(
        default="none", metadata={"help": "none: train the whole model; lora, ia3 or prompt_tuning: train only "
                                          "that adapter (through peft), the base weights frozen. Checkpoints "
                                          "record the adapter's flags and base, and resume only with the same. "
                                          "On a random base (no --model_name_or_path): a warning, and exports "
                                          "save the base in <export>/base/. To evaluate or predict with an "
                                          "export: --do_train false --model_name_or_path <run>/best, no --peft."})
    lora_r: int = field(default=8, metadata={"help": "LoRA's rank r."})
    # alpha / r = 8 and every linear layer: a small alpha / r, or q and v alone (peft's defaults),
    # left LoRA at the majority class on t5-tiny (docs/results/peft.md).
    lora_alpha: int = field(default=64, metadata={"help": "LoRA's alpha: its update is scaled by alpha / r (the "
                                                          "defaults: 64 / 8 = 8)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on LoRA's input."})
    use_dora: bool = field(
        default=False, metadata={"help": "LoRA as DoRA (Liu et al. 2024): each targeted weight is split into its "
                                         "column norms, a trainable magnitude (d_out more parameters per matrix), "
                                         "and a direction that takes the low-rank update. Merges like LoRA."})
    lora_target_modules: str | None = field(
        default=None, metadata={"help": "Comma list of the linear layers LoRA adapts, e.g. q,v. Default: every "
                                        "linear layer but the output layer (q,k,v,o,wi,wo for T5; wi_0,wi_1 "
                                        "for a gated feed-forward). lm_head only where it is not tied to the "
                                        "input embedding (T5's is)."})
    ia3_target_modules: str | None = field(
        default=None, metadata={"help": "Comma list of the layers IA3 rescales. Default: peft's (k,v,wo for T5)."})
    ia3_feedforward_modules: str | None = field(
        default=None, metadata={"help": "Which of --ia3_target_modules are feed-forward layers (their input is "
                                        "scaled, not their output). Default: peft's (wo for T5)."})
    num_virtual_tokens: int = field(default=20, metadata={"help": "Prompt tuning: soft tokens before the input."})
    prompt_init: Literal["random", "vocab", "text"] = field(
        default="vocab", metadata={"help": "Prompt tuning's initial tokens: embeddings of sampled vocabulary "
                                           "(vocab), of --prompt_init_text (text), or random."})
    prompt_init_text: str | None = field(default=None, metadata={"help": "With --prompt_init text."})

    def __post_init__(self):
        self.check_adapter_flags()

    def check_adapter_flags(self) -> None:
        """One line for the first bad adapter flag (fine_tune_t5.py calls it first among its checks)."""
        if self.lora_r < 1 or self.lora_alpha <= 0:
            raise UsageError(f"--lora_r must be >= 1 and --lora_alpha > 0, got {self.lora_r} and {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise UsageError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.use_dora and self.peft != "lora":
            raise UsageError(f"--use_dora is a kind of LoRA: pass it with --peft lora, not --peft {self.peft}")
        if self.num_virtual_tokens < 1:
            raise UsageError(f"--num_virtual_tokens must be at least 1, got {self.num_virtual_tokens}")
        if self.peft == "prompt_tuning" and (self.prompt_init == "text") != bool(self.prompt_init_text):
            raise UsageError("--prompt_init text and --prompt_init_text go together: pass both, or neither")
        if self.peft != "none":
            frozen = [f"--{name}" for name in ("freeze_encoder", "freeze_decoder", "freeze_embeddings")
                      if getattr(self, name, False)]
            if frozen:
                raise UsageError(f"{frozen[0]} with --peft {self.peft}: the adapter already freezes every base weight "
                                 "and trains only its own; drop " + " and ".join(frozen))

    def check_given(self, given: frozenset[str]) -> None:
        """Refuses another method's flags (`given`: the flags typed): without its --peft they would do nothing."""
        for method, names in METHOD_FLAGS.items():
            typed = [f"--{name}" for name in names if name in given]
            if typed and method != self.peft:
                one = len(typed) == 1
                flags, verb, them = " and ".join(typed), "applies" if one else "apply", "it" if one else "them"
                if self.peft == "none":
                    raise UsageError(f"{flags} {verb} to --peft {method}, and this run trains the whole model "
                                     f"(--peft none): add --peft {method}, or drop {them}")
                raise UsageError(f"{flags} {verb} to --peft {method}, and this run trains --peft {self.peft}: drop "
                                 f"{them}, or use --peft {method}")
        parent = super()
        if hasattr(parent, "check_given"):
            parent.check_given(given)


def default_learning_rate(config) -> float | None:
    """The rate an unset --learning_rate means for this run's adapter (LEARNING_RATES), or None without one."""
    if not in_use(config):
        return None
    return LEARNING_RATES["dora" if config.use_dora else config.peft]


def in_use(config) -> bool:
    """True when the run trains an adapter: its checkpoints then hold the trainable weights only."""
    return getattr(config, "peft", "none") != "none"


def is_adapter_model(model) -> bool:
    """True for a peft-wrapped model. Never imports peft: a model cannot be one unless peft is loaded."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def is_prompt_tuned(model) -> bool:
    return is_adapter_model(model) and model.active_peft_config.is_prompt_learning


def mergeable(model) -> bool:
    """LoRA and IA3 fold into the base weights; prompt tuning does not."""
    return is_adapter_model(model) and not is_prompt_tuned(model)


def _names(value: str | None) -> list[str] | None:
    return [name.strip() for name in value.split(",") if name.strip()] if value else None


def peft_config(config: AdapterConfig, model, tokenizer_name: str | None):
    """The peft config `--peft` and its knobs describe, for a seq2seq model."""
    import peft

    task = peft.TaskType.SEQ_2_SEQ_LM
    if config.peft == "lora":
        targets = _names(config.lora_target_modules)
        adapter_targets.check_targets(model, "--lora_target_modules", targets)
        targets = targets or adapter_targets.default_lora_targets(model)
        return peft.LoraConfig(task_type=task, r=config.lora_r, lora_alpha=config.lora_alpha,
                               lora_dropout=config.lora_dropout, target_modules=targets, use_dora=config.use_dora)
    if config.peft == "ia3":
        targets, feedforward = _names(config.ia3_target_modules), _names(config.ia3_feedforward_modules)
        adapter_targets.check_targets(model, "--ia3_target_modules", targets)
        if feedforward and not targets:
            raise UsageError("--ia3_feedforward_modules needs --ia3_target_modules, of which it is a subset")
        if feedforward and not set(feedforward) <= set(targets):
            raise UsageError(f"--ia3_feedforward_modules {','.join(feedforward)} must be a subset of "
                             f"--ia3_target_modules {','.join(targets)}")
        return peft.IA3Config(task_type=task, target_modules=targets, feedforward_modules=feedforward)
    # One set of soft tokens, in front of the encoder's input (Lester et al.). peft would make a
    # second set for the decoder of a seq2seq model, which its forward never uses.
    return peft.PromptTuningConfig(task_type=task, num_virtual_tokens=config.num_virtual_tokens,
                                   num_transformer_submodules=1,
                                   prompt_tuning_init=_PROMPT_INIT[config.prompt_init],
                                   prompt_tuning_init_text=config.prompt_init_text,
                                   tokenizer_name_or_path=tokenizer_name if config.prompt_init == "text" else None)


def apply(model, config: AdapterConfig, tokenizer_name: str | None = None, *, zero3: bool = False,
          random_base: bool = False, log=print):
    """`model` wrapped with the adapter `--peft` names (base weights frozen), or unchanged for `none`.

    `zero3`: the run is under DeepSpeed ZeRO-3, which peft's DoRA cannot run under. `random_base`:
    `model` was initialised at random, not loaded; a warning is logged and exports save the base.
    """
    if config.peft == "none":
        return model
    if config.use_dora and zero3:
        # DoRA reads each frozen weight whole (its column norms) outside the layer's own forward,
        # where ZeRO-3 holds only this process's shard: peft fails there with an IndexError.
        raise UsageError("--use_dora does not run under DeepSpeed ZeRO-3, which keeps only a shard of each frozen "
                         "weight that DoRA must read whole; use ZeRO-2 (accelerate_configs/deepspeed_zero2.yaml) or "
                         "plain LoRA (drop --use_dora)")
    import peft

    adapter = peft_config(config, model, tokenizer_name)
    try:
        with warnings.catch_warnings():
            # peft asks transformers 5 for is_gradient_checkpointing, which warns that it is deprecated.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            wrapped = peft.get_peft_model(model, adapter)
    except (ValueError, TypeError) as err:
        # e.g. a model type peft has no default targets for: name them.
        raise UsageError(f"--peft {config.peft} could not be applied: {first_line(err)}; name the layers "
                         f"with --{config.peft}_target_modules") from None
    if random_base:
        setattr(wrapped, _RANDOM_BASE, True)
        log(f"warning: --peft {config.peft} adapts a randomly initialised model (--config_name without "
            "--model_name_or_path): its frozen base is random weights that exist nowhere else, so every export "
            f"saves them in <export>/{BASE_DIR}/ beside the adapter; pass --model_name_or_path to adapt a trained model")
    return wrapped


def base_model(model):
    """The transformers model underneath: with LoRA or IA3 its layers carry the adapter, so calling
    it runs the adapter too; a prompt-tuned model's prompt must be added by `encode`."""
    return model.get_base_model() if is_adapter_model(model) else model


def encode(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's output and its attention mask; a prompt-tuned model's soft tokens come first.

    Evaluation runs the encoder once per row and the decoder on its output (evaluation.GreedyDecoder),
    so it cannot go through peft's forward, which adds the prompt inside.
    """
    base = base_model(model)
    if not is_prompt_tuned(model):
        return base.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state, attention_mask
    embeds = base.get_input_embeddings()(input_ids)
    prompt = model.get_prompt(batch_size=len(input_ids)).to(embeds.dtype)
    embeds = torch.cat([prompt, embeds], dim=1)
    mask = torch.cat([attention_mask.new_ones(len(input_ids), prompt.size(1)), attention_mask], dim=1)
    return base.get_encoder()(inputs_embeds=embeds, attention_mask=mask).last_hidden_state, mask


def save_pretrained(model, state_dict: dict, folder: str, final: str | None = None) -> None:
    """The adapter in folder/adapter/ and, for LoRA and IA3, the merged model in folder/.

    `state_dict` is the whole wrapped model's (gathered under ZeRO-3). The merge happens on a
    fresh copy built from it, so the model being trained is never changed and ZeRO-3's partitioned
    weights never have to be merged in place. A random base (see `apply`) is saved in folder/base/,
    and the adapter's config names it by its absolute path once `folder` is renamed to `final`, so
    that peft's AutoPeftModelForSeq2SeqLM loads the adapter with its base.
    """
    config = model.active_peft_config
    named = config.base_model_name_or_path
    if getattr(model, _RANDOM_BASE, False):
        _fresh_copy(model, state_dict, merged=False).save_pretrained(os.path.join(folder, BASE_DIR),
                                                                     safe_serialization=True)
        config.base_model_name_or_path = os.path.abspath(os.path.join(final or folder, BASE_DIR))
    try:
        model.save_pretrained(os.path.join(folder, ADAPTER_DIR), state_dict=state_dict, safe_serialization=True)
    finally:
        config.base_model_name_or_path = named
    if mergeable(model):
        merged_copy(model, state_dict).save_pretrained(folder, safe_serialization=True)


def merged_copy(model, state_dict: dict):
    """A plain transformers model holding `state_dict`'s base weights with the adapter folded in."""
    return _fresh_copy(model, state_dict, merged=True)


def _fresh_copy(model, state_dict: dict, *, merged: bool):
    """A plain transformers model holding `state_dict`'s base weights, with the adapter folded in or left out."""
    import peft

    base = model.get_base_model()
    copy = _share_like(peft.get_peft_model(type(base)(base.config), model.active_peft_config), model)
    result = copy.load_state_dict(state_dict, strict=False)
    # A tied weight (T5's shared embedding and output layer) may be stored under one of its names only.
    loaded = {id(p) for name, p in copy.named_parameters(remove_duplicate=False) if name in state_dict}
    params = dict(copy.named_parameters(remove_duplicate=False))
    missing = [k for k in result.missing_keys if k not in params or id(params[k]) not in loaded]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"the adapter model's weights do not fit a fresh copy (missing {missing[:3]}, "
                           f"unexpected {result.unexpected_keys[:3]})")
    if is_prompt_tuned(copy):
        return copy.get_base_model()
    return copy.merge_and_unload() if merged else copy.unload()


def _share_like(copy, base):
    """`copy` with its parameters shared exactly as `base` shares them. Built from a config, a
    model's sharing follows the config's tie_word_embeddings, which need not say what `base` holds:
    for a T5 v1.1 (False) transformers 5 would build the encoder's and decoder's embeddings apart
    from `shared` too (an export of three equal matrices), and for a loaded one whose flag still
    says True, its output layer would be the embedding."""
    owners: dict[int, str] = {}
    own: set[int] = set()
    for name, param in base.named_parameters(remove_duplicate=False):
        owner = owners.setdefault(id(param), name)
        module, _, leaf = name.rpartition(".")
        parameter = copy.get_parameter(owner)
        if owner == name and id(parameter) in own:  # apart in base, shared in the copy
            parameter = torch.nn.Parameter(torch.empty_like(parameter), requires_grad=parameter.requires_grad)
        own.add(id(parameter))
        setattr(copy.get_submodule(module), leaf, parameter)
    return copy
