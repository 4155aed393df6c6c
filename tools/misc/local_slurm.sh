#!/usr/bin/env bash
# A one-machine Slurm cluster to try tools/slurm_train.sh and tools/slurm_test.sh locally:
#
#   eval "$(bash tools/misc/local_slurm.sh start)"   # prints: export SLURM_CONF=DIR/slurm.conf
#   bash tools/misc/local_slurm.sh status
#   bash tools/misc/local_slurm.sh stop
#
# start installs Debian's slurm-wlm and munge with apt-get where missing, writes a
# slurm.conf for this machine (one node: nproc CPUs, 90% of MemTotal; one partition) and
# a munge key under its own folder DIR, starts munged, slurmctld and slurmd as root on
# that folder's files and waits until `srun -n 1 hostname` runs. Nothing under /etc is
# read or written: the clients find the cluster through SLURM_CONF. stop ends the daemons
# (and the cluster's jobs) and removes DIR.
#
# Environment: MMCIRC_SLURM_DIR (DIR, default /tmp/mmcirc-slurm), MMCIRC_SLURM_PORT
# (slurmctld's port, slurmd's is the next one; default 16817), MMCIRC_SLURM_PARTITION
# (default local).
# Exit status: 0 done, 1 failed, 3 this machine cannot run it (not root, or apt-get cannot
# install the packages).
set -uo pipefail

DIR=${MMCIRC_SLURM_DIR:-/tmp/mmcirc-slurm}
PORT=${MMCIRC_SLURM_PORT:-16817}
PARTITION=${MMCIRC_SLURM_PARTITION:-local}
MARK="$DIR/.mmcirc-local-slurm"
CONF="$DIR/slurm.conf"
DAEMONS=(slurmd slurmctld munged)

say() { echo "[local_slurm] $*" >&2; }
die() { echo "error: local_slurm.sh: $1" >&2; exit "${2:-1}"; }
# A start that fails once a daemon runs: the daemons ended, DIR (its logs) kept.
fail() { stop_daemons; die "$1"; }

alive() { [ -s "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

install_packages() {
    command -v munged >/dev/null && command -v slurmctld >/dev/null \
        && command -v slurmd >/dev/null && command -v srun >/dev/null && return 0
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get" 3
    local apt=(apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 slurm-wlm munge)
    say "installing slurm-wlm and munge (apt-get)"
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" >"$DIR/apt.log" 2>&1 \
        || { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$DIR/apt.log" 2>&1 \
             && DEBIAN_FRONTEND=noninteractive "${apt[@]}" >>"$DIR/apt.log" 2>&1; } \
        || die "apt-get could not install slurm-wlm and munge (log: $DIR/apt.log)" 3
    rm -f "$DIR/apt.log"
}

write_conf() {
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    cat >"$CONF" <<EOF
# Written by tools/misc/local_slurm.sh: one node, this machine.
ClusterName=mmcirc-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/slurmd
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munged() {
    dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$DIR/munge.key"
    munged --socket="$DIR/munge.socket" --key-file="$DIR/munge.key" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" \
        --seed-file="$DIR/munged.seed" --force \
        || fail "munged did not start (log: $DIR/munged.log)"
}

stop_daemons() {
    if alive slurmctld; then
        SLURM_CONF="$CONF" timeout 10 scancel --partition="$PARTITION" >/dev/null 2>&1
    fi
    local name pids=() i
    for name in "${DAEMONS[@]}"; do
        alive "$name" && pids+=("$(cat "$DIR/$name.pid")")
    done
    [ "${#pids[@]}" = 0 ] && return 0
    kill "${pids[@]}" 2>/dev/null
    for i in $(seq 100); do kill -0 "${pids[@]}" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "${pids[@]}" 2>/dev/null
}

cmd_start() {
    [ "$(id -u)" = 0 ] || die "start needs root (munged, slurmctld and slurmd run as root)" 3
    if [ -e "$MARK" ]; then
        if alive slurmctld && alive slurmd; then
            say "already running ($DIR)"
            echo "export SLURM_CONF=$CONF"
            return 0
        fi
        stop_daemons
        rm -rf "$DIR"
    elif [ -e "$DIR" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
        die "$DIR exists and was not made by this script (set MMCIRC_SLURM_DIR)"
    fi
    mkdir -p "$DIR" && chmod 0700 "$DIR" && touch "$MARK" || die "cannot create $DIR"
    install_packages
    mkdir -p "$DIR/ctld" "$DIR/slurmd"
    write_conf
    start_munged
    say "starting slurmctld and slurmd (ports $PORT, $((PORT + 1)); $CONF)"
    slurmctld -f "$CONF" || fail "slurmctld did not start (log: $DIR/slurmctld.log)"
    slurmd -f "$CONF" || fail "slurmd did not start (log: $DIR/slurmd.log)"
    local deadline=$((SECONDS + 90))
    until SLURM_CONF="$CONF" timeout 20 srun -p "$PARTITION" -n 1 -t 1 hostname >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] \
            || fail "srun -n 1 hostname did not run within 90 s (logs: $DIR/slurmctld.log, $DIR/slurmd.log)"
        sleep 1
    done
    say "up: partition $PARTITION, $(nproc) CPUs on $(hostname -s)"
    echo "export SLURM_CONF=$CONF"
}

cmd_stop() {
    [ -e "$MARK" ] || { say "not running ($DIR)"; return 0; }
    stop_daemons
    rm -rf "$DIR"
    say "stopped; $DIR removed"
}

cmd_status() {
    local name state=0
    [ -e "$MARK" ] || { say "not running ($DIR)"; return 1; }
    for name in "${DAEMONS[@]}"; do
        if alive "$name"; then say "$name: running"; else say "$name: not running"; state=1; fi
    done
    [ "$state" = 0 ] && SLURM_CONF="$CONF" sinfo >&2
    return "$state"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) die "usage: local_slurm.sh start|stop|status" 2 ;;
esac
