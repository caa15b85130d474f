"""Launched by tests/multitask_test.py under `accelerate launch`: each process writes the mixture rows it is dealt.

    python -m accelerate.commands.launch --multi_gpu --num_processes 2 tests/mixture_shard_probe.py OUT <flags>

The loader is built and prepared as fine_tune_t5.py builds and prepares it; OUT/rank<N>.json holds
the first 40 training rows process N receives (their `idx`, the row among the tasks' rows laid
end to end) and the mixture's order for the epoch.
"""
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fine_tune_t5  # noqa: E402
from t5_training import multitask, runtime  # noqa: E402
from t5_training.config import parse_config  # noqa: E402
from t5_training.modeling import load_tokenizer_and_model  # noqa: E402


def main(out: str, argv: list[str]) -> None:
    config = parse_config(fine_tune_t5.FineTuneConfig, argv)
    accelerator = runtime.build_accelerator(config)
    tokenizer, model = load_tokenizer_and_model(config)
    tasks = multitask.read_tasks(config, multitask.entries(config), tokenizer, log=lambda *_: None)
    loader, _ = multitask.build_loaders(tasks, config, tokenizer, model.config.decoder_start_token_id,
                                        accelerator.num_processes)
    order = loader.sampler.order(0).tolist()
    loader = accelerator.prepare(loader)
    loader.set_epoch(0)
    rows = []
    for batch in loader:
        rows += batch["idx"].tolist()
        if len(rows) >= 40:
            break
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w", encoding="utf-8") as f:
        json.dump({"rows": rows, "order": order}, f)
    runtime.close(accelerator)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
