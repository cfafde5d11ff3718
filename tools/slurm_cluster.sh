#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for the tests (slurmctld + slurmd + munged, loopback).
#
#   bash tools/slurm_cluster.sh start    # install slurm-wlm/munge if missing, configure, start, wait until idle
#   bash tools/slurm_cluster.sh status   # daemons and `sinfo`
#   bash tools/slurm_cluster.sh stop     # stop the daemons this script started and remove their state
#
# Idempotent: `start` on a running cluster only checks that it is up. Runs as root (CI). The node is this
# host (`hostname -s`) with its CPUs and memory; proctrack/linuxproc and task/none, so no cgroups are needed
# (they are not available in every container). No accounting daemon: `hpcdl slurm status` falls back to
# `scontrol show job`, which keeps finished jobs for MinJobAge seconds.
set -euo pipefail

SLURM_ETC=/etc/slurm
SLURM_CONF="$SLURM_ETC/slurm.conf"
RUN_DIR=/run/hpcdl-slurm           # pid files of the daemons this script started
STATE_DIR=/var/spool/hpcdl-slurm   # slurmctld state and slurmd spool
LOG_DIR=/var/log/hpcdl-slurm
PARTITION=debug

log() { echo "slurm_cluster: $*" >&2; }
die() { log "$*"; exit 1; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return
    fi
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are missing and installing them needs root"
    log "installing slurm-wlm and munge from the OS packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q slurm-wlm munge
}

# Alive and not a zombie: a killed daemon whose parent never reaps it still answers kill -0.
pid_alive() {
    local state
    [ -f "$1" ] || return 1
    state=$(ps -o stat= -p "$(cat "$1")" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "${state:0:1}" != Z ]
}

start_munge() {
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating a munge key"
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    if pid_alive "$RUN_DIR/munged.pid"; then
        return
    fi
    if munge -n </dev/null >/dev/null 2>&1; then
        die "a munged this script did not start is already running; stop it first"
    fi
    # A munged killed without `stop` (e.g. when a session ends) leaves its pid file and socket behind;
    # no working munged answers here, so they are stale.
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock "$RUN_DIR/munged.pid"
    # Daemons get no stdio: one holding the caller's stdout open would keep a pipe reader waiting forever.
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid </dev/null >/dev/null 2>&1
    for _ in $(seq 50); do
        [ -s /run/munge/munged.pid ] && break
        sleep 0.1
    done
    cp /run/munge/munged.pid "$RUN_DIR/munged.pid"
    munge -n </dev/null | unmunge >/dev/null || die "munge does not work; see /var/log/munge/munged.log"
}

write_conf() {
    local host cpus mem_mb
    host=$(hostname -s)
    cpus=$(nproc --all)
    # RealMemory a little under the total so slurmd's own check never marks the node invalid.
    mem_mb=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.95 }' /proc/meminfo)
    mkdir -p "$SLURM_ETC" "$STATE_DIR/ctld" "$STATE_DIR/d" "$LOG_DIR"
    cat >"$SLURM_CONF" <<EOF
# Written by hpcdl tools/slurm_cluster.sh: a one-node test cluster on $host.
ClusterName=hpcdl
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire + 1 s before it may start again (default 120 s); 20 s still gives a loaded
# slurmd time to take a job's credential before it expires.
AuthInfo=cred_expire=20
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Look for startable jobs every 5 s (defaults 60 and 30 s): a requeued job, held until its begin time, then
# starts within seconds instead of waiting for the next pass (tests/test_train_slurm.py requeues a job twice).
SchedulerParameters=sched_interval=5,bf_interval=5
ReturnToService=2
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
InactiveLimit=0
KillWait=10
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

wait_idle() {
    local host state
    host=$(hostname -s)
    for _ in $(seq 120); do
        state=$(timeout 5 sinfo -h -n "$host" -o '%T' 2>/dev/null || true)
        case "$state" in
            idle|mixed|allocated) log "node $host is $state"; return 0 ;;
            *drain*|*down*|*fail*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
        esac
        sleep 0.5
    done
    die "node $host did not become idle (sinfo: '${state:-nothing}'); see $LOG_DIR/*.log"
}

start() {
    install_packages
    mkdir -p "$RUN_DIR"
    start_munge
    if pid_alive "$RUN_DIR/slurmctld.pid" && pid_alive "$RUN_DIR/slurmd.pid"; then
        wait_idle
        return
    fi
    # Start both daemons afresh: a half-running pair or pid files left by killed daemons would stall sinfo.
    stop_daemon slurmd
    stop_daemon slurmctld
    rm -rf "$STATE_DIR"
    write_conf
    slurmctld -i </dev/null >/dev/null 2>&1
    slurmd </dev/null >/dev/null 2>&1
    for name in slurmctld slurmd; do
        for _ in $(seq 50); do
            pid_alive "$RUN_DIR/$name.pid" && break
            sleep 0.2
        done
        pid_alive "$RUN_DIR/$name.pid" || die "$name did not start; see $LOG_DIR/$name.log"
    done
    wait_idle
}

stop_daemon() {
    local name=$1 pidfile="$RUN_DIR/$1.pid" pid
    pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    rm -f "$pidfile"
    log "stopped $name ($pid)"
}

stop() {
    # Jobs still running would outlive slurmd as orphans; cancel them first.
    if pid_alive "$RUN_DIR/slurmctld.pid"; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    fi
    stop_daemon slurmd
    stop_daemon slurmctld
    stop_daemon munged
    rm -rf "$STATE_DIR"
}

status() {
    local rc=0 name
    for name in munged slurmctld slurmd; do
        if pid_alive "$RUN_DIR/$name.pid"; then
            echo "$name: running (pid $(cat "$RUN_DIR/$name.pid"))"
        else
            echo "$name: stopped"
            rc=1
        fi
    done
    [ "$rc" = 0 ] && sinfo
    return "$rc"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 start|stop|status" ;;
esac
