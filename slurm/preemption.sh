# Sourced by the sbatch scripts in this folder: a job that Slurm stops early saves a checkpoint
# and comes back in the queue.
#
#   run_preemptible FORWARD COMMAND...
#
# runs COMMAND in the background and waits for it. When the batch shell gets USR1 (the
# `--signal=B:USR1@120` warning before the time limit, or `scancel --signal=USR1 --batch JOB`)
# or TERM, FORWARD passes USR1 on to the training processes; they finish the optimizer step in
# flight, save a checkpoint and exit with code 75 (t5_training/interrupts.py). Once COMMAND has
# ended, the job is requeued, and its next start runs the same command, which resumes from that
# checkpoint (--resume_from_checkpoint auto).
#
# Why the signal must not reach the launcher: `accelerate launch` has no handler for USR1, so
# USR1 kills it, and its workers with it, before they can save. COMMAND therefore starts with
# USR1 ignored; an ignored signal stays ignored across fork and exec, so the launcher and all
# it starts ignore USR1 too, except the training processes, which install their own handler
# once they train. That makes it safe to send USR1 to every process of the job (`scancel
# --signal=USR1 --full`, or srun relaying it to a whole step). A USR1 that arrives while the
# workers still load data is lost, but then nothing has trained since the last checkpoint.
# TERM, which Slurm sends to every process at the time limit or on `scancel`, is ignored the
# same way, so that the launcher outlives its workers: torch's elastic agent installs its own
# TERM handler, which waits up to 30 s for them, but accelerate's single-process launcher
# would die at once and the job would be requeued while its worker still saves.
#
# Workers always get USR1, even when the batch shell got TERM: they treat both alike, and srun
# answers a TERM by killing its step outright (checked with Slurm 22.05).
#
# When to requeue. After USR1, always unless COMMAND finished anyway (exit 0). After TERM, only
# when the job hit its time limit: TERM also comes from `scancel`, and `scontrol requeue`
# would bring back a job its user cancelled (it succeeds on a cancelling job). Slurm requeues
# jobs that it preempts itself when the cluster's PreemptMode is REQUEUE. The exit status
# cannot decide it: `accelerate launch` turns a worker's 75 into its own 1.

preempted_by=""

# The launcher's children, found when the signal comes: torch's elastic agent and accelerate's
# single-process launcher both start the training processes as direct children, each in a
# session of its own, so a signal to the launcher's process group would miss them.
forward_to_children() {
    pkill -USR1 -P "$preemptible_pid" || echo "preemption: found no training process to signal"
}

# srun relays USR1 to every process of its step, on every node.
forward_through_srun() {
    kill -USR1 "$preemptible_pid"
}

_on_signal() {
    # A newline first: the log's last line is usually a progress bar that ends in a carriage return.
    printf '\n'
    echo "preemption: $1 received at $(date +%T); asking the training processes to checkpoint and stop"
    preempted_by=${preempted_by:-$1}
    "$2"
}

run_preemptible() {
    local forward=$1
    shift
    (trap '' USR1 TERM; exec "$@") &
    preemptible_pid=$!
    trap "_on_signal USR1 $forward" USR1
    trap "_on_signal TERM $forward" TERM

    # `wait` returns early whenever a trapped signal arrives; bash keeps the exit status, so
    # the last `wait` returns COMMAND's own.
    while kill -0 "$preemptible_pid" 2>/dev/null; do
        wait "$preemptible_pid" || true
    done
    local status=0
    wait "$preemptible_pid" || status=$?

    if [[ -z $preempted_by || $status -eq 0 ]]; then
        return "$status"
    fi
    if [[ $preempted_by == TERM ]] && ! scontrol show job "$SLURM_JOB_ID" | grep -q "Reason=TimeLimit"; then
        echo "preemption: stopped by TERM (exit $status); not requeued, as a cancelled job must stay cancelled"
        return 75
    fi
    echo "preemption: training stopped (exit $status); requeueing job $SLURM_JOB_ID to resume from its newest checkpoint"
    scontrol requeue "$SLURM_JOB_ID"
    return 75
}
