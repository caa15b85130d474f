"""The T5 pretraining collators, under the name users import them by.

    from data_collator_t5 import DataCollatorForT5MLM
    collator = DataCollatorForT5MLM(tokenizer, input_length=512, noise_density=0.15, mean_noise_span_length=3.0)
    batch = collator([{"input_ids": ids} for ids in chunks])   # each chunk raw_length tokens long

Span corruption (T5's objective) and prefix LM are in t5_training/collators.py, UL2's mixture of
denoisers in t5_training/denoisers.py, both following Google's t5/data/preprocessors.py (each
module's docstring names the functions it follows); pre_train_t5.py builds them from its flags. A wheel installs them as `t5_training.collators` and `t5_training.denoisers` only.
"""
from t5_training.collators import (DataCollatorForPrefixLM, DataCollatorForT5MLM,  # noqa: F401
                                   compute_input_and_target_lengths)
from t5_training.denoisers import DataCollatorForDenoiserMixture  # noqa: F401

__all__ = ["DataCollatorForT5MLM", "DataCollatorForPrefixLM", "DataCollatorForDenoiserMixture",
           "compute_input_and_target_lengths"]
