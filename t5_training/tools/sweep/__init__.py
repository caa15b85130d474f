"""The offline W&B sweep runner, `python -m t5_training.sweep` (see cli.py), by concern:

    cli        flags and main: the trials of one runner, or a Slurm array (slurm)
    config     the runner's settings
    schema     the sweep YAML, checked against W&B's schema and this runner
    engine     W&B's `sweeps` search engine: proposals and hyperband
    state      sweep_state.json, shared by runners under a lock
    command    a trial's command, its macros filled in as a W&B agent fills them
    supervise  running that command through hyperband stops, preemption and Ctrl-C
    trial      one trial, run to its end and recorded
    results    the trials' evaluations read back, ranked into results.md and results.json
"""
