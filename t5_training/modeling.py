"""Loading a tokenizer and an encoder-decoder model, from the hub, a folder, or a config file.

`--model_name_or_path` loads pretrained weights; `--config_name` (a JSON file such as
`configs/t5-tiny.json`, or a hub name) builds a randomly initialised model instead. Remote code
runs only with `--trust_remote_code`.
"""
from __future__ import annotations

from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

from t5_training.errors import UsageError


def load_tokenizer(name: str | None, trust_remote_code: bool = False):
    if not name:
        raise UsageError("no tokenizer: pass --tokenizer_name (a folder from `python -m t5_training.tokenizer` "
                         "or a hub name) or --model_name_or_path")
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise UsageError(f"could not load tokenizer {name!r}: {str(err).splitlines()[0]}") from None


def load_model(model_name_or_path: str | None, config_name: str | None, tokenizer, *,
               trust_remote_code: bool = False, overrides: dict | None = None):
    """Pretrained weights from `model_name_or_path`, or a fresh model shaped by `config_name`.

    A fresh model's vocabulary is sized to the tokenizer (rounded up to a multiple of 8 for
    fast matmuls); a pretrained model whose embeddings are smaller than the tokenizer is an error.
    `overrides` sets config attributes such as dropout_rate.
    """
    overrides = dict(overrides or {})
    try:
        if model_name_or_path:
            model = AutoModelForSeq2SeqLM.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code,
                                                          **overrides)
        elif config_name:
            config = AutoConfig.from_pretrained(config_name, trust_remote_code=trust_remote_code, **overrides)
            config.vocab_size = -(-len(tokenizer) // 8) * 8
            config.pad_token_id = tokenizer.pad_token_id
            config.eos_token_id = tokenizer.eos_token_id
            config.decoder_start_token_id = tokenizer.pad_token_id
            model = AutoModelForSeq2SeqLM.from_config(config, trust_remote_code=trust_remote_code)
        else:
            raise UsageError("no model: pass --model_name_or_path (pretrained) or --config_name (from scratch)")
    except (OSError, ValueError) as err:
        if isinstance(err, UsageError):
            raise
        source = model_name_or_path or config_name
        raise UsageError(f"could not load model {source!r}: {str(err).splitlines()[0]}") from None
    embeddings = model.get_input_embeddings().num_embeddings
    if embeddings < len(tokenizer):
        raise UsageError(f"the tokenizer has {len(tokenizer)} tokens but the model only {embeddings} embeddings; "
                         "use the tokenizer the model was trained with")
    return model


def load_tokenizer_and_model(config):
    """The tokenizer and model a `ModelConfig` names, with dropout and gradient checkpointing applied."""
    tokenizer = load_tokenizer(config.tokenizer_name or config.model_name_or_path, config.trust_remote_code)
    overrides = {"dropout_rate": config.dropout_rate} if config.dropout_rate is not None else {}
    model = load_model(config.model_name_or_path, config.config_name, tokenizer,
                       trust_remote_code=config.trust_remote_code, overrides=overrides)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return tokenizer, model


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
