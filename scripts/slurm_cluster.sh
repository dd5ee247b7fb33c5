#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for the multi-host tests.
#
#   scripts/slurm_cluster.sh start    install (if missing), configure, start, wait until idle
#   scripts/slurm_cluster.sh stop     stop the daemons (state and logs stay under $STATE)
#   scripts/slurm_cluster.sh status   sinfo, or exit 1 when the controller does not answer
#
# Needs root and Debian (apt). Idempotent: `start` on a running cluster with the same
# configuration does nothing; a changed configuration restarts the daemons.
#
# Layout: munged (run as the munge user) authenticates; one slurmctld; two slurmd daemons
# started as `slurmd -N node1` / `slurmd -N node2`, both on 127.0.0.1 with distinct ports
# (Debian builds Slurm with multiple-slurmd support). Process tracking by /proc
# (proctrack/linuxproc, no cgroups), no task affinity (task/none), no accounting. State,
# spool directories, pid files and logs live under $STATE (default /tmp/regency-slurm); the
# configuration is written to /etc/slurm/slurm.conf so plain `sbatch`/`squeue` find it.
set -euo pipefail

STATE=${REGENCY_SLURM_STATE:-/tmp/regency-slurm}
CONF=/etc/slurm/slurm.conf
CTLD_PORT=${REGENCY_SLURM_CTLD_PORT:-6817}
NODE_PORTS=(6818 6819)
NODES=(node1 node2)
PACKAGES=(slurmctld slurmd slurm-client munge)

log() { echo "slurm_cluster: $*" >&2; }

need_root() {
    if [[ $(id -u) -ne 0 ]]; then
        log "must run as root"
        exit 1
    fi
}

install_packages() {
    "$(dirname "$0")/apt_install.sh" "${PACKAGES[@]}"
}

# Print the pid in pidfile $1 if that process is alive and runs $2.
alive() {
    local pidfile=$1 name=$2 pid
    [[ -f $pidfile ]] || return 1
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] || return 1
    echo "$pid"
}

write_config() {
    local host cpus mem i
    host=$(hostname -s)
    cpus=$(nproc)
    # Both nodes are this machine: each is declared with the machine's real CPUs and memory
    # (slurmd refuses to register a node configured larger than the hardware).
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
    mem=$(( ${mem:-2048} * 9 / 10 ))
    {
        echo "# Written by regency scripts/slurm_cluster.sh: two slurmd on one machine."
        echo "ClusterName=regency"
        echo "SlurmctldHost=${host}(127.0.0.1)"
        echo "SlurmctldPort=${CTLD_PORT}"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "MpiDefault=none"
        echo "SwitchType=switch/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SchedulerType=sched/builtin"
        echo "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0"
        echo "ReturnToService=2"
        echo "SlurmdTimeout=30"
        echo "InactiveLimit=0"
        echo "KillWait=2"
        echo "MinJobAge=30"
        echo "MessageTimeout=10"
        echo "StateSaveLocation=${STATE}/ctld"
        echo "SlurmctldPidFile=${STATE}/slurmctld.pid"
        echo "SlurmctldLogFile=${STATE}/slurmctld.log"
        echo "SlurmdSpoolDir=${STATE}/spool/%n"
        echo "SlurmdPidFile=${STATE}/slurmd-%n.pid"
        echo "SlurmdLogFile=${STATE}/slurmd-%n.log"
        for i in "${!NODES[@]}"; do
            echo "NodeName=${NODES[$i]} NodeHostname=${host} NodeAddr=127.0.0.1" \
                "Port=${NODE_PORTS[$i]} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES" \
            "MaxTime=INFINITE State=UP"
    }
}

start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge /etc/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    # Running already (ours, or one a package's init script started): nothing to do.
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    munge -n | unmunge >/dev/null
}

stop_daemons() {
    local f pid
    for f in "$STATE"/slurmd-*.pid "$STATE"/slurmctld.pid; do
        [[ -f $f ]] || continue
        pid=$(alive "$f" slurmd || alive "$f" slurmctld || true)
        if [[ -n $pid ]]; then
            kill "$pid" 2>/dev/null || true
            timeout 20 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$f"
    done
}

wait_idle() {
    local deadline=$((SECONDS + ${1:-60})) states
    while ((SECONDS < deadline)); do
        states=$(sinfo -h -N -o '%N=%t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
        # Both nodes up: idle, or already running someone's job.
        if [[ $(grep -o -E '=(idle|mix|alloc)' <<<"$states" | wc -l) -eq ${#NODES[@]} ]]; then
            log "ready: $states"
            return 0
        fi
        sleep 0.2
    done
    log "nodes not ready after ${1:-60}s: ${states:-no answer}"
    tail -n 20 "$STATE"/*.log >&2 || true
    return 1
}

start() {
    need_root
    install_packages
    mkdir -p "$STATE/ctld" "$STATE/spool"
    local new restart=0 i
    new=$(write_config)
    if [[ ! -f $CONF ]] || [[ $(cat "$CONF") != "$new" ]]; then
        mkdir -p "$(dirname "$CONF")"
        printf '%s\n' "$new" >"$CONF"
        restart=1
    fi
    start_munge
    if ((restart)); then
        stop_daemons
    fi
    if ! alive "$STATE/slurmctld.pid" slurmctld >/dev/null; then
        # -c: start from a clean state (jobs of an earlier run of this test cluster are gone).
        slurmctld -c
    fi
    for i in "${!NODES[@]}"; do
        mkdir -p "$STATE/spool/${NODES[$i]}"
        if ! alive "$STATE/slurmd-${NODES[$i]}.pid" slurmd >/dev/null; then
            slurmd -N "${NODES[$i]}"
        fi
    done
    wait_idle 60
}

case ${1:-start} in
    start) start ;;
    stop) need_root; stop_daemons ;;
    status) sinfo ;;
    *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
