"""An adapter run's export read back, to evaluate or predict with it afterwards.

    python fine_tune_t5.py --benchmark glue --dataset_name sst2 --model_name_or_path runs/pt/best \
        --do_train false --do_predict --data_dir ../shared/data/SST-2 --output_dir runs/pt-test

An export of a `--peft` run (adapters.save_pretrained) holds the adapter in <export>/adapter/, the
tokenizer in <export>/, a randomly initialised base in <export>/base/ and, for LoRA and IA3, the
merged model in <export>/ itself, which loads as any model. A prompt-tuned export has no merged
model (a prompt cannot be folded into weights), so it is found here (`find`), its frozen base
named (`base_of`), and the adapter put on that base by peft's own PeftModel.from_pretrained
(`load`); evaluation then adds the prompt as training did (adapters.encode). An adapter/ folder
itself, of any method, loads the same way.
"""
from __future__ import annotations

import os

from t5_training import adapters
from t5_training.errors import UsageError, first_line

ADAPTER_CONFIG = "adapter_config.json"  # peft's name for the file that says what the adapter is and its base
MODEL_CONFIG = "config.json"  # transformers': a folder with it is a model (an export's merged model included)


def find(path: str | None) -> str | None:
    """The adapter folder that --model_name_or_path `path` names, or None where it names a model.

    `path` itself when it holds adapter_config.json; its adapter/ when it is an export without a
    merged model (prompt tuning's). A LoRA or IA3 export is its merged model: None.
    """
    if not path or not os.path.isdir(path):
        return None
    if os.path.isfile(os.path.join(path, ADAPTER_CONFIG)):
        return path
    inner = os.path.join(path, adapters.ADAPTER_DIR)
    if not os.path.isfile(os.path.join(path, MODEL_CONFIG)) and os.path.isfile(os.path.join(inner, ADAPTER_CONFIG)):
        return inner
    return None


def _export_of(adapter: str) -> str:
    """The export an adapter folder sits in: where the run saved the tokenizer and any random base beside it."""
    folder = os.path.normpath(adapter)
    return os.path.dirname(folder) if os.path.basename(folder) == adapters.ADAPTER_DIR else folder


def _peft_config(adapter: str):
    import peft

    try:
        return peft.PeftConfig.from_pretrained(adapter)
    except (OSError, ValueError, TypeError) as err:
        raise UsageError(f"{os.path.join(adapter, ADAPTER_CONFIG)} could not be read as a peft adapter's config "
                         f"({first_line(err)}); pass a run's best/ or final/, or a model") from None


def method(adapter: str) -> str:
    """The --peft method the adapter was trained with: lora, ia3, prompt_tuning (or peft's name of another)."""
    return str(_peft_config(adapter).peft_type.value).lower()


def base_of(adapter: str) -> str | None:
    """The frozen model the adapter was trained on.

    A random base saved beside it (<export>/base/) wins over the absolute path adapter_config.json
    records for it, so that a run folder that was moved still finds its base; otherwise the
    base_model_name_or_path peft recorded (the run's --model_name_or_path).
    """
    saved = os.path.join(_export_of(adapter), adapters.BASE_DIR)
    if os.path.isfile(os.path.join(saved, MODEL_CONFIG)):
        return saved
    return _peft_config(adapter).base_model_name_or_path


def tokenizer_source(adapter: str) -> str | None:
    """Where the tokenizer of an adapter is: its export (which saves it), the adapter folder, else its base."""
    for folder in (_export_of(adapter), adapter):
        if os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
            return folder
    return base_of(adapter)


def refuse_training(adapter: str, path: str) -> None:
    """Refuses to fine-tune an adapter export as if it were a model: it holds no model to train."""
    name = method(adapter)
    raise UsageError(f"--model_name_or_path {path} holds a {name} adapter, not a model to train: evaluate or predict "
                     "with it (fine_tune_t5.py --do_train false); to train it further, resume its run with "
                     f"--resume_from_checkpoint, or train a new adapter on its base ({base_of(adapter)}) with "
                     f"--peft {name}")


def load(adapter: str, load_base):
    """The adapter on its base, frozen, for evaluation: peft's PeftModel.from_pretrained over `load_base(base)`.

    `load_base(name)` loads a model as the run loads --model_name_or_path (modeling.load_model);
    a base it cannot load is one line naming the base and where the adapter records it.
    """
    import peft

    base = base_of(adapter)
    where = os.path.join(adapter, ADAPTER_CONFIG)
    if not base:
        raise UsageError(f"{where} names no base model (base_model_name_or_path): set it to the folder or hub name "
                         "of the model the adapter was trained on")
    try:
        model = load_base(base)
    except UsageError as err:
        raise UsageError(f"the adapter in {adapter} adapts the base model {base!r}, which could not be loaded ({err}); "
                         f"edit base_model_name_or_path in {where} to where that model is now") from None
    try:
        return peft.PeftModel.from_pretrained(model, adapter).eval()
    except (OSError, ValueError, RuntimeError) as err:
        raise UsageError(f"the adapter in {adapter} does not fit its base model {base!r} "
                         f"({first_line(err)}); set base_model_name_or_path in {where} to the model it "
                         "was trained on") from None
