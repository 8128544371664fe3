#!/usr/bin/env bash
# A single-node SLURM cluster on localhost, from Debian's packages, for tests and demos: munged
# (authentication), MariaDB and slurmdbd (job accounting: `sacct`, which Snakemake's SLURM
# executor asks for job states), slurmctld (the controller) and slurmd (the one compute node).
#
#   scripts/local-slurm.sh install                  # apt packages, once (root; Debian/Ubuntu)
#   scripts/local-slurm.sh start                    # all five daemons, in about 10 s
#   snakemake --workflow-profile profiles/slurm caches
#   scripts/local-slurm.sh status                   # daemons, node state, recent jobs
#   scripts/local-slurm.sh stop                     # stops them all and deletes the state folder
#
# Runs as root, without systemd, listening on 127.0.0.1 only. Every file it makes (configs, the
# munge key and socket, the database, spool, logs, pid files) lives under LOCAL_SLURM_DIR
# (default /tmp/local-slurm), except one link, /run/slurm/conf -> $LOCAL_SLURM_DIR/etc, through
# which sinfo, sbatch, sacct and the jobs' srun find the configuration. `stop` removes the folder,
# the link and the empty slurm_localhost cgroup folders that slurmd leaves. Both take only a
# folder that is root's alone, under folders that are (root_only): the daemons run as root on it.
# Ports: LOCAL_SLURM_PORT (default 6817) for slurmctld, +1 slurmd, +2 slurmdbd, +3 MariaDB.
#
# Process tracking: where the cgroup v1 hierarchies (freezer, cpuset, memory) are mounted and
# writable, the node uses proctrack/cgroup, task/cgroup (cores and memory enforced) and
# jobacct_gather/cgroup, as a production node does. Elsewhere (cgroup v2 only: Slurm 22.05's
# cgroup/v2 needs slurmd started by systemd in a delegated cgroup) it falls back to
# proctrack/linuxproc, task/none and jobacct_gather/linux: jobs run and are accounted, but
# memory and core limits are not enforced. LOCAL_SLURM_CGROUP=no forces the fallback.
# docs/scaling.md explains each choice.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/tmp/local-slurm}
PORT=${LOCAL_SLURM_PORT:-6817}
CGROUP=${LOCAL_SLURM_CGROUP:-auto}
PACKAGES="munge slurmctld slurmd slurmdbd slurm-client mariadb-server"
CONF=$DIR/etc/slurm.conf
export SLURM_CONF=$CONF
# Where a configless slurmd keeps its copy of the configuration, and where every SLURM command
# looks when neither SLURM_CONF nor /etc/slurm/slurm.conf exists. Jobs need it: Snakemake's job
# step strips all SLURM_* variables (SLURM_CONF included) before its srun.
LINK=/run/slurm/conf
# `start` writes this into the folder it makes; `stop` deletes only a folder that has it (or, from
# an older start, a slurm.conf with this script's header), never one LOCAL_SLURM_DIR merely names
MARK=$DIR/.made-by-local-slurm

die() { echo "local-slurm: $*" >&2; exit 1; }

# Dies unless $DIR and every folder above it are root's alone: the daemons run as root on what the
# folder holds (slurm.conf's Prolog, the munge key and socket, the pid files `stop` kills). In a
# shared /tmp another user could make the folder first and swap its contents, or name a pid for root
# to kill; one who owns or may write any folder above it could move the whole tree aside after the
# check. A folder above it may be open to all only with the sticky bit (/tmp): then nobody else can
# rename or delete what root made there.
# $1: what to do instead.
root_only() {
  local up mode advice=$1
  if [ -L "$DIR" ]; then die "$DIR is a symbolic link; $advice"; fi
  if [ -e "$DIR" ]; then
    mode=$(stat -c %a "$DIR")
    if [ "$(stat -c %u "$DIR")" != 0 ] || (( 8#$mode & 8#022 )); then
      die "$DIR (mode $mode, owner $(stat -c %U "$DIR")) is not root's alone: another user may have made or changed it; $advice"
    fi
  fi
  # the folders above it as written (a link among them: its own owner) and as they resolve
  for up in "$(dirname "$(realpath -s -m "$DIR")")" "$(realpath -m "$DIR/..")"; do
    while :; do
      mode=$(stat -c %a "$up") || die "$up: cannot read it"
      if [ "$(stat -c %u "$up")" != 0 ] || { [ ! -L "$up" ] && (( 8#$mode & 8#022 )) && ! (( 8#$mode & 8#1000 )); }; then
        die "$up (mode $mode, owner $(stat -c %U "$up")), a folder above $DIR, is not root's alone; $advice"
      fi
      [ "$up" = / ] && break
      up=$(dirname "$up")
    done
  done
}

need_root() {
  [ "$(id -u)" = 0 ] || die "run as root: the daemons run as root here (SlurmUser=root)"
}

missing_packages() {
  local p
  for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
  done
}

cmd_install() {
  need_root
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  [ -z "${missing// /}" ] && { echo "local-slurm: packages present"; return; }
  # Debian's postinst scripts start each service; without systemd that fails, so a policy-rc.d
  # denies service starts for the duration of the install (Docker images ship the same file).
  local policy=/usr/sbin/policy-rc.d
  if [ ! -e $policy ]; then
    trap "rm -f $policy" EXIT
    printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  echo "local-slurm: installed $missing"
}

# Waits up to $1 seconds for the command after it to succeed.
wait_for() {
  local limit=$1 i
  shift
  for ((i = 0; i < limit * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  return 1
}

use_cgroup() {
  case $CGROUP in
    no) return 1 ;;
    auto|yes) ;;
    *) die "LOCAL_SLURM_CGROUP must be auto, yes or no, not '$CGROUP'" ;;
  esac
  local c probe
  for c in freezer cpuset memory; do
    probe=/sys/fs/cgroup/$c/local-slurm-probe.$$
    mkdir "$probe" 2>/dev/null && rmdir "$probe" || {
      [ "$CGROUP" = yes ] && die "LOCAL_SLURM_CGROUP=yes but /sys/fs/cgroup/$c (cgroup v1) is not writable"
      return 1
    }
  done
}

write_configs() {
  local node tracking
  # CPUs, sockets, cores and RealMemory exactly as slurmd detects them on this machine
  node=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]*//')
  if use_cgroup; then
    tracking="ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup"
    printf 'CgroupPlugin=cgroup/v1\nConstrainCores=yes\nConstrainRAMSpace=yes\n' > "$DIR/etc/cgroup.conf"
  else
    tracking="ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux"
  fi
  cat > "$CONF" <<EOF
# Written by scripts/local-slurm.sh: one node, localhost only, everything under $DIR.
ClusterName=local
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
$tracking
# the default 30 s sampling misses the peak memory of jobs shorter than that (MaxRSS 0 in sacct)
JobAcctGatherFrequency=task=2
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((PORT + 2))
# with slurmdbd, this names the munge socket for the controller's connection to slurmdbd
AccountingStoragePass=$DIR/munge/munge.socket
# keep sbatch --comment in the database: Snakemake puts the rule and wildcards there
AccountingStoreFlags=job_comment
NodeName=localhost NodeAddr=127.0.0.1$node State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((PORT + 2))
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT + 3))
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DIR/etc/slurmdbd.conf"  # slurmdbd refuses a readable one: it holds a password
}

start_munge() {
  mungekey -c -k "$DIR/munge/munge.key"
  munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed"
  wait_for 10 sh -c "munge -S '$DIR/munge/munge.socket' -n | unmunge -S '$DIR/munge/munge.socket'" ||
    die "munged did not answer; see $DIR/log/munged.log"
}

start_mariadb() {
  mariadb-install-db --no-defaults --user=root --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
    --skip-test-db > "$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $DIR/log/mariadb-install.log"
  # innodb_lock_wait_timeout=900 is what slurmdbd asks for; the small buffer pool keeps it light.
  # mariadbd does not daemonise itself: setsid detaches it from this shell's terminal and session.
  setsid mariadbd --no-defaults --user=root --datadir="$DIR/mysql" --socket="$DIR/run/mysqld.sock" \
    --pid-file="$DIR/run/mariadbd.pid" --bind-address=127.0.0.1 --port=$((PORT + 3)) \
    --log-error="$DIR/log/mariadbd.log" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    --skip-name-resolve < /dev/null > /dev/null 2>&1 &
  wait_for 60 mariadb-admin --no-defaults --socket="$DIR/run/mysqld.sock" ping ||
    die "MariaDB did not start; see $DIR/log/mariadbd.log"
  mariadb --no-defaults --socket="$DIR/run/mysqld.sock" -e "
    CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

cmd_start() {
  need_root
  root_only "set LOCAL_SLURM_DIR to a new folder whose every parent is root's alone"
  [ -z "$(missing_packages)" ] || die "packages missing: $(missing_packages | tr '\n' ' ')- run: $0 install"
  [ -e "$DIR/run" ] && die "$DIR exists: already started? run '$0 stop' first"
  [ -e /etc/slurm/slurm.conf ] && die "/etc/slurm/slurm.conf exists: this machine has its own SLURM; use that"
  if [ -e $LINK ] || [ -L $LINK ]; then
    local other
    other=$(dirname "$(readlink $LINK)")
    die "$LINK exists: the SLURM under $other is configured; stop it: LOCAL_SLURM_DIR=$other $0 stop"
  fi
  if [ -d "$DIR" ] && [ ! -e "$MARK" ] && [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR exists and was not made by $0; set LOCAL_SLURM_DIR to a new folder (stop deletes it)"
  fi
  [ -d "$DIR" ] || mkdir -m 700 "$DIR" || die "$DIR: cannot make it"   # not -p: nobody else's folder adopted
  mkdir -p "$DIR"/{etc,munge,log,run,spool/ctld,spool/d}
  touch "$MARK"
  chmod 755 "$DIR" "$DIR/munge"  # munged wants its socket folder traversable by everyone
  write_configs
  mkdir -p "$(dirname $LINK)" && ln -s "$DIR/etc" $LINK
  start_munge
  start_mariadb
  slurmdbd
  # the controller's first start needs the database's TRES table: wait until slurmdbd answers
  wait_for 60 sacctmgr -n list cluster || die "slurmdbd did not answer; see $DIR/log/slurmdbd.log"
  slurmctld
  wait_for 30 scontrol ping || die "slurmctld did not answer; see $DIR/log/slurmctld.log"
  slurmd -N localhost
  wait_for 30 sh -c "sinfo -h -N -o %t | grep -qx idle" || die "node not idle; see $DIR/log/slurmd.log"
  # slurmctld registers the cluster in slurmdbd on its first contact (with account and user root)
  wait_for 30 sh -c "sacctmgr -n -P list assoc cluster=local format=user | grep -qx root" ||
    die "cluster not registered in slurmdbd; see $DIR/log/slurmctld.log"
  echo "local-slurm: running under $DIR ($(grep ^ProctrackType "$CONF"))"
}

# True once none of the given pids is alive.
all_gone() {
  local pid
  for pid in "$@"; do
    if kill -0 "$pid" 2>/dev/null; then return 1; fi
  done
}

# Sends SIGTERM to the daemons named (pid files under run/), then waits up to $1 seconds for all
# of them to exit before a SIGKILL.
stop_daemons() {
  local limit=$1 name pid pids=()
  shift
  for name in "$@"; do
    [ -f "$DIR/run/$name.pid" ] || continue
    pid=$(cat "$DIR/run/$name.pid")
    if kill "$pid" 2>/dev/null; then pids+=("$pid"); fi
  done
  [ ${#pids[@]} = 0 ] && return 0
  wait_for "$limit" all_gone "${pids[@]}" || kill -9 "${pids[@]}" 2>/dev/null || true
}

cmd_stop() {
  [ -d "$DIR" ] || { echo "local-slurm: nothing under $DIR"; return; }
  [ -e "$MARK" ] || head -n 1 "$CONF" 2>/dev/null | grep -q '^# Written by scripts/local-slurm.sh' ||
    die "$DIR was not made by $0 (no $MARK): not stopping anything or deleting it"
  need_root
  root_only "not trusting its pid files: stop its daemons by hand (ps -ef | grep -E 'slurm|munged|mariadbd'), then delete it"
  # cancel every job and wait until they are gone: a job step left running keeps its
  # slurmstepd alive after slurmd stops (KillWait=5: SIGKILL 5 s after the SIGTERM)
  if [ -f "$DIR/run/slurmctld.pid" ] && scontrol ping >/dev/null 2>&1; then
    scancel --full --partition local 2>/dev/null || true
    wait_for 30 sh -c '[ -z "$(squeue -h -o %i)" ]' || echo "local-slurm: jobs still running; stopping anyway" >&2
  fi
  stop_daemons 20 slurmd slurmctld slurmdbd  # together: the folder goes anyway
  stop_daemons 30 mariadbd munged             # after them: they talk to both while stopping
  [ "$(readlink $LINK)" = "$DIR/etc" ] && rm -f $LINK && rmdir "$(dirname $LINK)" 2>/dev/null || true
  find /sys/fs/cgroup/*/slurm_localhost -depth -type d -exec rmdir {} + 2>/dev/null || true
  rm -rf "$DIR"
  echo "local-slurm: stopped; $DIR removed"
}

cmd_status() {
  local name ok=0
  for name in munged mariadbd slurmdbd slurmctld slurmd; do
    if [ -f "$DIR/run/$name.pid" ] && kill -0 "$(cat "$DIR/run/$name.pid")" 2>/dev/null; then
      echo "$name: running (pid $(cat "$DIR/run/$name.pid"))"
    else
      echo "$name: not running"
      ok=1
    fi
  done
  [ "$ok" = 0 ] || return 1
  grep '^ProctrackType' "$CONF"
  sinfo -N -o "%N %t %c %m"
  sacct -X -a -S now-1hours -o JobID,JobName%20,State,Elapsed,ExitCode | tail -n 10
}

case ${1:-} in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 install|start|stop|status   (state in LOCAL_SLURM_DIR=$DIR)" >&2; exit 2 ;;
esac
