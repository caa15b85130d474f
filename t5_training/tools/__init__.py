"""Command-line tools that training never imports: the tokenizer trainer, the memory estimator (and
its activation tracer), the dataset inspector and the offline sweep runner.

Each command keeps its short name through an alias module, e.g. `python -m t5_training.memory`.
"""
