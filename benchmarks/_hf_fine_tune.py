"""HF's side of benchmarks/fine_tune_throughput.py: Seq2SeqTrainer on the same rows, timed as the project's side is."""
from __future__ import annotations

import time

from _harness import tokenized_rows


def run_hf(job: dict) -> dict:
    from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                              Seq2SeqTrainingArguments, TrainerCallback, default_data_collator)

    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    model = AutoModelForSeq2SeqLM.from_pretrained(job["model"])
    train = tokenized_rows(job, tokenizer, "train", job["train_rows"])
    if job["pad_to_max_length"]:
        # What run_summarization.py does with pad_to_max_length: pad to the max lengths at
        # tokenization time, -100 in padded labels, then the default collator stacks rows.
        src, tgt, pad = job["max_source_length"], job["max_target_length"], tokenizer.pad_token_id
        train = train.map(lambda row: {
            "input_ids": row["input_ids"] + [pad] * (src - len(row["input_ids"])),
            "attention_mask": [1] * len(row["input_ids"]) + [0] * (src - len(row["input_ids"])),
            "labels": row["labels"] + [-100] * (tgt - len(row["labels"])),
        })
        collate = default_data_collator
    else:
        # run_summarization.py's collator in fp32 (it pads to a multiple of 8 only under fp16).
        collate = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=None)

    batch_tokens: list[int] = []

    def counting_collator(features):
        batch = collate(features)
        batch_tokens.append(int(batch["attention_mask"].sum() + (batch["labels"] != -100).sum()))
        return batch

    untimed = job.get("untimed_steps", 0)

    class StepTimer(TrainerCallback):
        start = end = None
        steps = 0

        def on_epoch_begin(self, args, state, control, **kwargs):
            if self.start is None and not untimed:
                self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (untimed, job["steps"]) and job["device"] == "cuda":
                import torch

                # A span starts or ends when a step has run on the GPU, not when it was queued (as ours).
                torch.cuda.synchronize()
            self.end = time.perf_counter()
            self.steps += 1
            if state.global_step == untimed:
                self.start = self.end  # the untimed steps (a compile) end here

    timer = StepTimer()
    args = Seq2SeqTrainingArguments(
        output_dir=job["run_dir"], per_device_train_batch_size=job["batch_size"], max_steps=job["steps"],
        learning_rate=job["learning_rate"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, logging_steps=job["steps"], save_strategy="no", eval_strategy="no", report_to="none",
        use_cpu=job["device"] == "cpu", bf16=job["bf16"], dataloader_num_workers=0, seed=job["seed"],
        optim="adamw_torch_fused", torch_compile=job.get("compiled", False),
        torch_compile_backend=job.get("compile_backend", "inductor") if job.get("compiled") else None,
        # transformers 5's name for group_by_length: batches of similar lengths from its own sampler.
        train_sampling_strategy="group_by_length" if job.get("hf_group_by_length") else "random",
    )
    trainer = Seq2SeqTrainer(model=model, args=args, data_collator=counting_collator, train_dataset=train,
                             processing_class=tokenizer, callbacks=[timer])
    output = trainer.train()
    seconds = timer.end - timer.start
    assert timer.steps == job["steps"], f"trained {timer.steps} steps, not {job['steps']}"
    # accelerate's loader collates one batch ahead; the steps trained on the first `steps` batches.
    tokens, timed = sum(batch_tokens[untimed: timer.steps]), timer.steps - untimed
    return {"seconds": round(seconds, 3), "steps": timed, "tokens": tokens,
            "samples_per_second": round(timed * job["batch_size"] / seconds, 3),
            "tokens_per_second": round(tokens / seconds, 3), "train_loss": output.training_loss,
            "trainer_reported_samples_per_second": output.metrics["train_samples_per_second"]}
