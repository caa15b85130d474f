"""One process of tests/sharding_test.py: evaluation of an FSDP-sharded model, against the same model whole.

    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_worker.py VERSION OUT_DIR

Every process trains the same tiny T5 to copy its input (seeded, alone, so the copies agree),
keeps one copy whole and shards the other with FSDP VERSION (1: the FullyShardedDataParallel
wrapper, each T5Block a unit, as accelerate_configs/fsdp.yaml; 2: fully_shard), then decodes its
own rows with the project's GreedyDecoder, both ways, and writes what it got to
OUT_DIR/rank-R.json. The processes decode different rows and generate for different numbers of
steps, so a process that stopped running forward passes before the other would leave it waiting.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import sys
from types import SimpleNamespace

import torch

from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from transformers import T5Config, T5ForConditionalGeneration

from t5_training.batching import shift_right
from t5_training.evaluation import GreedyDecoder

VOCAB, EOS = 24, 1


def copy_rows(generator: torch.Generator, rows: int, length: int) -> dict:
    """Rows of `length` random tokens whose target is themselves, then EOS."""
    input_ids = torch.randint(3, VOCAB, (rows, length), generator=generator)
    labels = torch.cat([input_ids, torch.full((rows, 1), EOS)], dim=1)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels,
            "decoder_input_ids": shift_right(labels, 0, 0)}


def trained_model() -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, dropout_rate=0.0,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=EOS)
    model = T5ForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for step in range(150):
        batch = copy_rows(generator, 32, 2 + step % 5)
        model(**{k: batch[k] for k in ("input_ids", "attention_mask", "labels")}).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


def shard(model, version: str):
    from transformers.models.t5.modeling_t5 import T5Block

    if version == "1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={T5Block})
        return FullyShardedDataParallel(model, auto_wrap_policy=policy, use_orig_params=True,
                                        device_id=torch.device("cpu"))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for module in model.modules():
        if isinstance(module, T5Block):
            fully_shard(module, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main(version: str, out_dir: str) -> None:
    # A process left waiting fails within a minute instead of hanging the test.
    accelerator = Accelerator(cpu=True, kwargs_handlers=[
        InitProcessGroupKwargs(backend="gloo", timeout=datetime.timedelta(seconds=60))])
    rank = accelerator.process_index
    whole = trained_model()
    sharded = shard(trained_model(), version)
    # Rank 0 decodes 3 rows of 2 tokens, rank 1 5 rows of 5: their generations end at different steps.
    batch = copy_rows(torch.Generator().manual_seed(100 + rank), 3 + 2 * rank, 2 + 3 * rank)
    tokenizer = SimpleNamespace(pad_token_id=0)
    results = {}
    with torch.no_grad():
        for name, model in (("sharded", sharded), ("whole", whole)):
            decoder = GreedyDecoder(accelerator, tokenizer, max_new_tokens=8)
            predicted, loss, tokens = decoder(model, batch)
            results[name] = {"predicted": predicted.tolist(), "loss": loss.tolist(), "tokens": tokens.tolist(),
                             "generated_rows": decoder.generated_rows}
    results["labels"] = batch["labels"].tolist()
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(results, f)
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:])
