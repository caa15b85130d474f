"""Loading a tokenizer and an encoder-decoder model, from the hub, a folder, or a config file.

`--model_name_or_path` loads pretrained weights; `--config_name` (a JSON file such as
`configs/t5-tiny.json`, a shipped shape by name such as `t5-tiny`, or a hub name) builds a
randomly initialised model instead. Remote code runs only with `--trust_remote_code`. The names
are checked first (t5_training.model_sources).
"""
from __future__ import annotations

import copy

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.activations import NewGELUActivation

from t5_training import adapter_export
from t5_training.components import freeze
from t5_training.errors import UsageError
from t5_training.model_sources import (check_code_beside, check_local_path, check_shape, load_error,
                                      resolve_config_name)


# Span corruption's sentinels, which pre_train_t5.py needs and `python -m t5_training.tokenizer` adds.
NUM_SENTINELS = 100
SENTINELS = [f"<extra_id_{i}>" for i in range(NUM_SENTINELS)]


def has_sentinels(tokenizer) -> bool:
    """True iff "<extra_id_0>".."<extra_id_99>" are all in the vocab with distinct ids."""
    # get_vocab() rather than convert_tokens_to_ids: the latter maps unknown tokens to unk silently.
    vocab = tokenizer.get_vocab()
    ids = [vocab.get(tok) for tok in SENTINELS]
    return None not in ids and len(set(ids)) == NUM_SENTINELS


def mode_token_id(tokenizer, token: str | None) -> int | None:
    """The id of --mode_token (None without one), which must be one token of the tokenizer's vocabulary."""
    if token is None:
        return None
    vocab = tokenizer.get_vocab()
    if token not in vocab:
        raise UsageError(f"--mode_token {token!r} is not one token of this tokenizer; pass one it has (tokenizers "
                         "from `python -m t5_training.tokenizer` have [NLU], [NLG] and [S2S]) or drop --mode_token")
    return vocab[token]


def load_tokenizer(name: str | None, trust_remote_code: bool = False):
    if not name:
        raise UsageError("no tokenizer: pass --tokenizer_name (a folder from `python -m t5_training.tokenizer` "
                         "or a hub name) or --model_name_or_path")
    check_local_path(name, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise load_error("tokenizer", name, err) from None


def load_model(model_name_or_path: str | None, config_name: str | None, tokenizer, *,
               trust_remote_code: bool = False, overrides: dict | None = None):
    """Pretrained weights from `model_name_or_path`, or a fresh model shaped by `config_name`.

    A fresh model's vocabulary is sized to the tokenizer (rounded up to a multiple of 8 for
    fast matmuls); a pretrained model whose embeddings are smaller than the tokenizer is an error.
    `overrides` sets config attributes such as dropout_rate.
    """
    overrides = dict(overrides or {})
    config_path = resolve_config_name(config_name) if config_name else None
    if model_name_or_path:
        check_local_path(model_name_or_path, "--model_name_or_path")
    elif config_path:
        check_local_path(config_path, "--config_name")
    try:
        if model_name_or_path:
            model = AutoModelForSeq2SeqLM.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code,
                                                          **overrides)
            as_trained(model)
        elif config_name:
            check_code_beside(config_path)
            config = AutoConfig.from_pretrained(config_path, trust_remote_code=trust_remote_code, **overrides)
            check_shape(config, config_name)
            config.vocab_size = -(-len(tokenizer) // 8) * 8
            config.pad_token_id = tokenizer.pad_token_id
            config.eos_token_id = tokenizer.eos_token_id
            config.decoder_start_token_id = tokenizer.pad_token_id
            model = fresh_model(config, trust_remote_code=trust_remote_code)
        else:
            raise UsageError("no model: pass --model_name_or_path (pretrained) or --config_name (from scratch)")
    except (OSError, ValueError, StrictDataclassError) as err:
        if isinstance(err, UsageError):
            raise
        raise load_error("model", model_name_or_path or config_name, err) from None
    embeddings = model.get_input_embeddings().num_embeddings
    if embeddings < len(tokenizer):
        raise UsageError(f"the tokenizer has {len(tokenizer)} tokens but the model only {embeddings} embeddings; "
                         "use the tokenizer the model was trained with")
    return model


def fresh_model(config, *, trust_remote_code: bool = False, **from_config_kwargs):
    """A randomly initialised model shaped by `config`, as the scripts train it: T5 v1.1's output
    layer apart and drawn as Google draws it (`untie_output_layer`), its GELU in one kernel.
    `config` itself is left as it is: the model gets a copy. Other keyword arguments (such as
    attn_implementation) go to transformers' from_config."""
    return as_trained(AutoModelForSeq2SeqLM.from_config(copy.deepcopy(config), trust_remote_code=trust_remote_code,
                                                        **from_config_kwargs))


def as_trained(model):
    """`model`, built or loaded, made the model the scripts train: a fresh T5 v1.1's output layer
    apart (`untie_output_layer`), the config saying what the layers are (`record_output_layer`),
    the gated GELU in one kernel (`fuse_gelu`)."""
    untie_output_layer(model)
    record_output_layer(model)
    fuse_gelu(model)
    return model


def untie_output_layer(model) -> bool:
    """Gives a fresh T5 v1.1-style model (a config with `tie_word_embeddings: false`: v1.1,
    flan-t5, mT5) an output layer of its own, drawn as Mesh TensorFlow and t5x draw theirs; returns
    whether it did.

    transformers 5 reads that flag only as "do not scale the decoder's output" and ties the output
    layer to the input embedding regardless (its pretrained v1.1 checkpoints load apart because
    their two tensors differ). Left so, a fresh v1.1 would share one matrix between input and
    output, which v1.1 does not, and its logits would start about sqrt(d_model) times too large:
    the embedding is drawn with std 1.0, while Google draws the output layer as its other dense
    layers, a normal truncated at 2 std with std initializer_factor / sqrt(d_model).
    """
    config = model.config
    if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
        return False  # T5 1.0 and T5-style configs: one matrix, the output scaled by d_model ** -0.5
    head = model.get_output_embeddings()
    if head is None or head.weight is not model.get_input_embeddings().weight:
        return False  # apart already (a model class that honours the flag)
    std = getattr(config, "initializer_factor", 1.0) * head.in_features ** -0.5
    # Under DeepSpeed ZeRO-3's zero.Init the tied weight holds only this process's shard (ds_shape is
    # the whole); the new, whole one is partitioned when DeepSpeed wraps the model.
    shape = getattr(head.weight, "ds_shape", head.weight.shape)
    weight = torch.empty(shape, dtype=head.weight.dtype, device=head.weight.device)
    torch.nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
    head.weight = torch.nn.Parameter(weight)
    record_output_layer(model)  # so that saving keeps both, and nothing ties them again
    return True


def record_output_layer(model) -> bool:
    """Sets a loaded model's `tie_word_embeddings` to False when its output layer is apart from its
    input embedding (pretrained T5 v1.1, flan-t5, mT5, and this project's exports of them); returns
    whether it changed the flag.

    transformers 5 loads such a checkpoint's two tensors apart but leaves the flag True. Left so,
    `tie_weights()` (FSDP2's cpu_ram_efficient_loading calls it) would replace the trained output
    layer with the embedding, and the exported config.json would say `tie_word_embeddings: true`:
    transformers 4 and other readers of that file would tie the two and scale the decoder's output.
    """
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or head.weight is embedding.weight or not model.config.tie_word_embeddings:
        return False
    model.config.tie_word_embeddings = False
    return True


def fuse_gelu(model) -> int:
    """Runs each of transformers' `gelu_new` activations (T5 v1.1's gated GELU) as torch's one-kernel
    tanh GELU; returns how many it swapped.

    Both compute Mesh TensorFlow's gelu, 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), to fp32
    rounding. transformers writes it as eight elementwise passes over a d_ff-wide activation and
    autograd keeps four of their results for backward; the one kernel keeps only its input. No
    parameter or config field changes, so checkpoints and exports are those of the model as loaded.
    """
    return _swap_modules(model, NewGELUActivation, lambda: torch.nn.GELU(approximate="tanh"))


def unfuse_gelu(model) -> int:
    """transformers' own gelu_new modules back where `fuse_gelu` put torch's kernel (what the
    benchmarks and tests compare it with); returns how many it swapped."""
    return _swap_modules(model, torch.nn.GELU, NewGELUActivation)


def _swap_modules(model, kind: type, make) -> int:
    """Replaces every submodule of exactly type `kind` with `make()`; returns how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, make())
                swapped += 1
    return swapped


def load_tokenizer_and_model(config, *, evaluate_only: bool = False):
    """The tokenizer and model a `ModelConfig` names, with dropout and gradient checkpointing applied.

    `evaluate_only`: the model is only evaluated (fine_tune_t5.py --do_train false), so
    --model_name_or_path may name an adapter run's export, which holds no model of its own
    (t5_training.adapter_export): it is loaded frozen on its base, through peft.
    """
    overrides = {"dropout_rate": config.dropout_rate} if config.dropout_rate is not None else {}
    adapter = adapter_export.find(config.model_name_or_path)
    if adapter:
        if not evaluate_only:
            adapter_export.refuse_training(adapter, config.model_name_or_path)
        tokenizer = load_tokenizer(config.tokenizer_name or adapter_export.tokenizer_source(adapter),
                                   config.trust_remote_code)
        return tokenizer, adapter_export.load(adapter, lambda base: load_model(
            base, None, tokenizer, trust_remote_code=config.trust_remote_code, overrides=overrides))
    tokenizer = load_tokenizer(config.tokenizer_name or config.model_name_or_path, config.trust_remote_code)
    model = load_model(config.model_name_or_path, config.config_name, tokenizer,
                       trust_remote_code=config.trust_remote_code, overrides=overrides)
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
    freeze(model, encoder=config.freeze_encoder, decoder=config.freeze_decoder, embeddings=config.freeze_embeddings)
    return tokenizer, model


def enable_activation_checkpointing(model) -> None:
    """Recompute each block's activations in the backward pass instead of keeping them.

    Non-reentrant, as torch advises: the reentrant kind gives a block's weights no gradient unless
    one of its inputs carries one, which with frozen embeddings only a hook transformers adds for
    it arranges (tests/modeling_test.py checks the blocks train). transformers renamed the method
    within 5.x (`gradient_checkpointing_enable` is a deprecated alias from the release that added
    `activation_checkpointing_enable`); pyproject admits every 5.x, and a GPU image may hold an
    older one than a fresh install.
    """
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def check_lengths(model, **lengths: int) -> None:
    """Refuses lengths beyond the model's position embeddings, where it has absolute ones.

    T5's relative attention takes any length, so for T5 this never fires; a BART-style model
    would otherwise fail deep in an embedding lookup with an index error.
    """
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if not isinstance(limit, int):
        return
    for flag, length in lengths.items():
        if length > limit:
            raise UsageError(f"--{flag} {length} is longer than this model's {limit} position embeddings; "
                             f"use --{flag} {limit} or less")
