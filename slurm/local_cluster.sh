#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for CI and for trying the sbatch scripts locally:
#
#   sudo slurm/local_cluster.sh start    # munged, slurmctld, slurmd; returns once the node takes jobs
#   sudo slurm/local_cluster.sh stop     # stops the three daemons this script started
#
# Needs Debian's `slurm-wlm` and `munge` packages (apt-get install -y slurm-wlm munge) and root.
# It writes /etc/slurm/slurm.conf, so do not run it on a machine that is part of a real cluster.
set -euo pipefail

PIDFILES=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)  # stopped in this order

running() {
    [[ -f $1 ]] && kill -0 "$(<"$1")" 2>/dev/null
}

usage() {
    echo "usage: $0 start|stop" >&2
    exit 2
}

start() {
    [[ $EUID -eq 0 ]] || { echo "error: $0 start must run as root (it starts system daemons)" >&2; exit 1; }
    command -v slurmctld >/dev/null || { echo "error: Slurm is not installed: apt-get install -y slurm-wlm munge" >&2; exit 1; }

    # munge authenticates every Slurm message; its key comes with the package, or is made here once.
    mkdir -p /run/munge
    chown munge:munge /run/munge
    [[ -f /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create
    running /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
    if running /run/slurmctld.pid; then
        echo "slurm: already running (stop it first to start afresh)"
        return
    fi

    # No cgroup, accounting or MPI plugins: a container or a CI runner has none of them set up.
    # linuxproc tracks a job's processes by their parents, so torch's workers, which start
    # sessions of their own, still belong to the job. CR_CPU: jobs share out the 2 CPUs, and
    # memory is not a resource they must ask for. The node is named localhost, which resolves
    # on any machine; `slurmd -N localhost` tells slurmd it is that node, whatever the hostname.
    mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
    cat > /etc/slurm/slurm.conf <<EOF
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=${PIDFILES[1]}
SlurmdPidFile=${PIDFILES[0]}
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    slurmctld -c  # -c: forget the jobs of an earlier start; this cluster is for throwaway jobs
    slurmd -N localhost

    # The daemons return at once; the node takes jobs a few seconds later.
    for _ in $(seq 60); do
        if [[ $(sinfo --noheader --nodes localhost --format %t 2>/dev/null) == idle ]]; then
            echo "slurm: localhost is up ($(sinfo --version))"
            return
        fi
        sleep 0.5
    done
    echo "error: the Slurm node did not come up in 30 s; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
    exit 1
}

stop() {
    # By the PIDs the daemons wrote, never by name: other Slurm or munge daemons may run here.
    local pidfile pid
    for pidfile in "${PIDFILES[@]}"; do
        [[ -f $pidfile ]] || continue
        pid=$(<"$pidfile")
        if kill "$pid" 2>/dev/null; then
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$pidfile"
    done
}

[[ $# -eq 1 ]] || usage
case $1 in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
