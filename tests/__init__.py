"""Tests run offline: a hub name must fail fast instead of waiting ~25 s for the network."""
import os

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests' models are tiny: one thread beats two (tiny-T5 pretraining, 2 cores: 5.7 vs 2.8
# steps/s), because splitting such small matmuls costs more than it saves.
os.environ.setdefault("OMP_NUM_THREADS", "1")
