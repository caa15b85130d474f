"""Alias of `t5_training.tools.tokenizer`, so that `python -m t5_training.tokenizer` keeps its name."""
from t5_training.tools.tokenizer import main

if __name__ == "__main__":
    main()
