#!/usr/bin/env bash
# slurm.sh -- a throwaway SLURM cluster on this one host for rlctl's integration tests.
#   munged + mariadbd + slurmdbd (so sacct works) + slurmctld + one slurmd per fake node,
#   no systemd, no cgroups (proctrack/linuxproc, task/none), everything under $BASE.
#   Debian's slurm-wlm is built with MULTIPLE_SLURMD, so several slurmd share the host, each on its own port.
# Usage (root): slurm.sh install | up | down | status
# Knobs: BASE=/tmp/rlctl-test-slurm  SITES="sitea:2 siteb:2" (partition:nodes)  WITH_DBD=1  PORT_BASE=16800
#        NETNS_MAP="sitea=NS1,NS2 ..."  optional: run slurmd of node <site>-<i> inside the i-th netns of the list
# After up:  export SLURM_CONF=$BASE/slurm.conf
set -euo pipefail
BASE=${BASE:-/tmp/rlctl-test-slurm}
SITES=${SITES:-"sitea:2 siteb:2"}
WITH_DBD=${WITH_DBD:-1}
PORT_BASE=${PORT_BASE:-16800}
NETNS_MAP=${NETNS_MAP:-}
CTLD_ADDR=${CTLD_ADDR:-127.0.0.1}
HOST=$(hostname -s)
MYSQL_PORT=$((PORT_BASE + 6)); DBD_PORT=$((PORT_BASE + 19)); CTLD_PORT=$((PORT_BASE + 17))
MSOCK=$BASE/munge/munge.socket
log() { echo "[slurm.sh $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (slurmd runs jobs as root here)"

wait_for() { local t=$1 what=$2; shift 2; local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do [ $SECONDS -lt $end ] || { log "timeout waiting for $what"; return 1; }; sleep 0.3; done; }
tcp_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }
bg() { local name=$1; shift; setsid nohup "$@" >"$BASE/log/$name.out" 2>&1 </dev/null & echo $! >"$BASE/pids/$name.pid"; }

install() {
  local need=()
  command -v munged >/dev/null || need+=(munge)
  command -v slurmctld >/dev/null || need+=(slurmctld slurm-client)
  command -v slurmd >/dev/null || need+=(slurmd)
  if [ "$WITH_DBD" = 1 ]; then
    command -v slurmdbd >/dev/null || need+=(slurmdbd)
    command -v mariadbd >/dev/null || need+=(mariadb-server)
  fi
  [ ${#need[@]} -eq 0 ] && return 0
  log "apt-get install ${need[*]}"
  timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

ours() { [ -d "/proc/$1" ] && { grep -qaF "$BASE" "/proc/$1/cmdline" 2>/dev/null || grep -qaF "SLURM_CONF=$BASE" "/proc/$1/environ" 2>/dev/null; }; }
stop_pid() { local p=$1 i; ours "$p" || return 0; kill -TERM "$p" 2>/dev/null || true
  for i in $(seq 1 40); do { [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; } || return 0; sleep 0.25; done
  kill -KILL "$p" 2>/dev/null || true; }

down() {
  [ -d "$BASE" ] || return 0
  if [ -f "$BASE/slurm.conf" ]; then SLURM_CONF=$BASE/slurm.conf timeout 5 scancel --user=root --full >/dev/null 2>&1 || true; fi
  local f p anc=" $$ "
  for f in "$BASE"/pids/slurmd-*.pid "$BASE"/pids/slurmctld.pid "$BASE"/pids/slurmdbd.pid "$BASE"/pids/mariadbd.pid "$BASE"/pids/munged.pid; do
    if [ -f "$f" ]; then stop_pid "$(cat "$f")"; fi
  done
  p=$$; while [ "$p" -gt 1 ]; do p=$(sed -E 's/.*\) [A-Za-z] ([0-9]+) .*/\1/' "/proc/$p/stat"); anc+="$p "; done
  for d in /proc/[0-9]*; do  # leftover job steps inherit SLURM_CONF=$BASE/...; never kill our ancestors
    p=${d#/proc/}; [[ "$anc" == *" $p "* ]] && continue
    if grep -qaF "SLURM_CONF=$BASE" "$d/environ" 2>/dev/null && grep -qa 'SLURM_JOB_ID=' "$d/environ" 2>/dev/null; then
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$BASE"
  log "stopped, removed $BASE"
}

netns_of() { local m; for m in $NETNS_MAP; do if [ "${m%%=*}" = "$1" ]; then echo "${m#*=}" | cut -d, -f"$2"; return; fi; done; }
addr_of_ns() { nsenter --net="/run/netns/$1" ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1; }

write_slurm_conf() {
  local port=$((PORT_BASE + 200)) all=() s name n i ns addr
  cat <<CONF
ClusterName=rlctl
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MSOCK
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
KillWait=5
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/linux
CONF
  if [ "$WITH_DBD" = 1 ]; then
    printf 'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n'
    printf 'AccountingStoragePort=%s\nAccountingStoragePass=%s\n' "$DBD_PORT" "$MSOCK"
  else
    echo "AccountingStorageType=accounting_storage/none"
  fi
  for s in $SITES; do
    name=${s%%:*}; n=${s##*:}
    for i in $(seq 1 "$n"); do
      ns=$(netns_of "$name" "$i"); addr=127.0.0.1
      if [ -n "$ns" ]; then addr=$(addr_of_ns "$ns"); fi
      echo "NodeName=$name-$i NodeHostname=$HOST NodeAddr=$addr Port=$port CPUs=2 RealMemory=4000 State=UNKNOWN"
      echo "$name-$i $ns" >>"$BASE/nodes"
      port=$((port + 1))
    done
  done
  for s in $SITES; do
    name=${s%%:*}; n=${s##*:}
    echo "PartitionName=$name Nodes=$name-[1-$n] MaxTime=INFINITE State=UP"; all+=("$name-[1-$n]")
  done
  echo "PartitionName=all Nodes=$(IFS=,; echo "${all[*]}") Default=YES MaxTime=INFINITE State=UP"
}

write_dbd_conf() {
  cat <<CONF
AuthType=auth/munge
AuthInfo=socket=$MSOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$BASE/log/slurmdbd.log
PidFile=$BASE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
CONF
}

up() {
  local t0=$SECONDS
  install
  down
  mkdir -p "$BASE"/{pids,log,run,spool,state,munge}
  chmod 755 "$BASE" "$BASE/munge"   # munged checks these permissions
  : >"$BASE/nodes"
  write_slurm_conf >"$BASE/slurm.conf"
  mungekey --create --keyfile="$BASE/munge/munge.key" --force; chmod 600 "$BASE/munge/munge.key"
  bg munged munged -F --key-file="$BASE/munge/munge.key" --socket="$MSOCK" --pid-file="$BASE/munge/munged.pid" \
     --log-file="$BASE/log/munged.log" --seed-file="$BASE/munge/munged.seed"
  wait_for 15 munged bash -c "munge -S '$MSOCK' -n | unmunge -S '$MSOCK'" || die "munged: $(tail -3 "$BASE/log/munged.log")"
  export SLURM_CONF=$BASE/slurm.conf
  if [ "$WITH_DBD" = 1 ]; then
    write_dbd_conf >"$BASE/slurmdbd.conf"; chmod 600 "$BASE/slurmdbd.conf"
    timeout 180 mariadb-install-db --no-defaults --datadir="$BASE/mysql" --user=root --auth-root-authentication-method=socket \
      --skip-test-db >"$BASE/log/mariadb-install.log" 2>&1 || die "mariadb-install-db: $(tail -3 "$BASE/log/mariadb-install.log")"
    bg mariadbd mariadbd --no-defaults --datadir="$BASE/mysql" --user=root --socket="$BASE/run/mysqld.sock" \
       --pid-file="$BASE/run/mysqld.pid" --bind-address=127.0.0.1 --port=$MYSQL_PORT --innodb-buffer-pool-size=64M \
       --log-error="$BASE/log/mariadb.err"
    wait_for 60 mariadbd timeout 5 mariadb --no-defaults -S "$BASE/run/mysqld.sock" -uroot -e 'select 1' \
      || die "mariadbd: $(tail -3 "$BASE/log/mariadb.err")"
    timeout 10 mariadb --no-defaults -S "$BASE/run/mysqld.sock" -uroot -e "
      CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
      CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
      FLUSH PRIVILEGES;"
    bg slurmdbd slurmdbd -D
    wait_for 30 slurmdbd tcp_open 127.0.0.1 $DBD_PORT || die "slurmdbd: $(tail -3 "$BASE/log/slurmdbd.out")"
    timeout 15 sacctmgr -i add cluster rlctl >/dev/null
  fi
  bg slurmctld slurmctld -D -c -f "$SLURM_CONF"
  wait_for 30 slurmctld timeout 3 scontrol ping || die "slurmctld: $(tail -3 "$BASE/log/slurmctld.out")"
  local node ns
  while read -r node ns; do
    if [ -n "$ns" ]; then
      # nsenter --net, not "ip netns exec": the latter remounts /sys and hides the cgroup fs from slurmd
      bg "slurmd-$node" nsenter --net="/run/netns/$ns" slurmd -D -f "$SLURM_CONF" -N "$node"
    else
      bg "slurmd-$node" slurmd -D -f "$SLURM_CONF" -N "$node"
    fi
  done <"$BASE/nodes"
  local want; want=$(wc -l <"$BASE/nodes")
  wait_for 60 "nodes idle" bash -c "[ \$(timeout 3 sinfo -h -N -t idle -o %N | sort -u | wc -l) -ge $want ]" \
    || die "nodes not idle: $(sinfo -N 2>&1)"
  log "up in $((SECONDS - t0))s: $(sinfo -h -o '%P:%D' | tr '\n' ' ')(export SLURM_CONF=$SLURM_CONF)"
}

status() {
  local f
  for f in "$BASE"/pids/*.pid; do
    [ -f "$f" ] || continue
    if ours "$(cat "$f")"; then echo "$(basename "$f" .pid) running"; else echo "$(basename "$f" .pid) DEAD"; fi
  done
}

case "${1:-up}" in
  install) install ;;
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 install|up|down|status" ;;
esac
