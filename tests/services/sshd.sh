#!/usr/bin/env bash
# sshd.sh -- a private OpenSSH server on loopback for rlctl's integration tests (key auth only, no PAM).
# Usage (root): sshd.sh install | up | down | status
# Knobs: BASE=/tmp/rlctl-test-sshd  ADDR=127.0.0.1  PORT=2222
#        NETNS=     run sshd inside this network namespace (/run/netns/NAME; ADDR is one of its addresses)
#        CLIENT_KEY=  accept this existing client key (private key path; its .pub beside it) instead of
#                     generating $BASE/id_ed25519
#        PRIVATE_DIRS=  run sshd (and so every session) in its own mount namespace with an empty private
#                     tmpfs over each of these directories (e.g. "/tmp /root"): what the operator keeps there
#                     is invisible to the site, what the site writes there invisible to the operator.
#                     $BASE (sshd's own files) and PRIVATE_KEEP (e.g. the interpreter under /root/.pyenv)
#                     stay visible inside, bind-mounted back.
# After up: client key $CLIENT_KEY, known_hosts $BASE/known_hosts, ssh -F $BASE/ssh_config rlctl-test
set -euo pipefail
BASE=${BASE:-/tmp/rlctl-test-sshd}
ADDR=${ADDR:-127.0.0.1}
PORT=${PORT:-2222}
NETNS=${NETNS:-}
PRIVATE_DIRS=${PRIVATE_DIRS:-}
PRIVATE_KEEP=${PRIVATE_KEEP:-}
CLIENT_KEY=${CLIENT_KEY:-$BASE/id_ed25519}
log() { echo "[sshd.sh $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"

install() {
  [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && return 0
  log "apt-get install openssh-server openssh-client"
  timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
}

ours() { [ -d "/proc/$1" ] && grep -qaF "$BASE" "/proc/$1/cmdline" 2>/dev/null; }
down() {
  if [ -f "$BASE/sshd.bgpid" ]; then
    local p i; p=$(cat "$BASE/sshd.bgpid")
    if ours "$p"; then
      kill -TERM "$p" 2>/dev/null || true
      for i in $(seq 1 40); do { ours "$p" && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; } || break; sleep 0.25; done
      if ours "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
    fi
  fi
  rm -rf "$BASE"
}

up() {
  install
  down
  mkdir -p "$BASE"; chmod 700 "$BASE"
  timeout 20 ssh-keygen -q -t ed25519 -N '' -C rlctl-test-host -f "$BASE/host_ed25519"
  if [ "$CLIENT_KEY" = "$BASE/id_ed25519" ]; then
    timeout 20 ssh-keygen -q -t ed25519 -N '' -C rlctl-test-client -f "$CLIENT_KEY"
  fi
  [ -f "$CLIENT_KEY.pub" ] || die "no client public key $CLIENT_KEY.pub"
  cp "$CLIENT_KEY.pub" "$BASE/authorized_keys"; chmod 600 "$BASE/authorized_keys"
  # StrictModes no: /tmp is world-writable, and sshd would refuse the AuthorizedKeysFile path below it.
  # Subsystem sftp: fabric's put/get use SFTP. MaxStartups/MaxSessions: tests open many connections at once.
  cat >"$BASE/sshd_config" <<CONF
Port $PORT
ListenAddress $ADDR
HostKey $BASE/host_ed25519
PidFile $BASE/sshd.pid
AuthorizedKeysFile $BASE/authorized_keys
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
MaxStartups 200:30:400
MaxSessions 200
LogLevel VERBOSE
CONF
  mkdir -p /run/sshd; chmod 755 /run/sshd   # privilege-separation dir; sshd refuses to start without it
  timeout 10 /usr/sbin/sshd -t -f "$BASE/sshd_config" || die "sshd -t failed"
  # nsenter (no fork: it execs sshd, so $! is sshd), not `ip netns exec`, which also remounts /sys
  local private=()
  if [ -n "$PRIVATE_DIRS" ]; then
    # unshare without --fork and `exec sshd`: $! is still sshd. Inside the new mount namespace: keep
    # $BASE and $PRIVATE_KEEP at side mount points, cover each private dir with an empty tmpfs, bind
    # the kept ones back where they were.
    local keep=/run/rlctl-sshd-keep-$$
    mkdir -p "$keep"
    private=(unshare --mount --propagation private -- bash -ec '
      keep=$1; shift; n=0
      for k in $KEEP; do n=$((n + 1)); mkdir -p "$keep/$n"; mount --bind "$k" "$keep/$n"; done
      for d in $PRIVATE_DIRS; do mode=700; [ "$d" = /tmp ] && mode=1777; mount -t tmpfs -o mode=$mode rlctl-site "$d"; done
      n=0
      for k in $KEEP; do n=$((n + 1)); mkdir -p "$k"; mount --bind "$keep/$n" "$k"; umount "$keep/$n"; done
      exec "$@"' private "$keep")
  fi
  KEEP="$BASE $PRIVATE_KEEP" PRIVATE_DIRS=$PRIVATE_DIRS setsid nohup ${NETNS:+nsenter --net="/run/netns/$NETNS"} "${private[@]}" \
    /usr/sbin/sshd -D -e -f "$BASE/sshd_config" >"$BASE/sshd.log" 2>&1 </dev/null &
  echo $! >"$BASE/sshd.bgpid"
  local end=$((SECONDS + 15))
  until timeout 2 bash -c "exec 3<>/dev/tcp/$ADDR/$PORT" 2>/dev/null; do
    [ $SECONDS -lt $end ] || die "sshd not listening: $(tail -5 "$BASE/sshd.log")"; sleep 0.1
  done
  [ -z "$PRIVATE_DIRS" ] || rm -rf "/run/rlctl-sshd-keep-$$"  # empty side mount points (unmounted inside)
  local known="[$ADDR]:$PORT"; [ "$PORT" = 22 ] && known=$ADDR   # port 22 entries name the bare host
  echo "$known $(cut -d' ' -f1,2 "$BASE/host_ed25519.pub")" >"$BASE/known_hosts"
  cat >"$BASE/ssh_config" <<CONF
Host rlctl-test
  HostName $ADDR
  Port $PORT
  User $(id -un)
  IdentityFile $CLIENT_KEY
  IdentitiesOnly yes
  UserKnownHostsFile $BASE/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
CONF
  log "sshd on $ADDR:$PORT${NETNS:+ in netns $NETNS} (key $CLIENT_KEY)"
}

case "${1:-up}" in
  install) install ;;
  up) up ;;
  down) down ;;
  status) if [ -f "$BASE/sshd.bgpid" ] && ours "$(cat "$BASE/sshd.bgpid")"; then echo running; else echo "not running"; fi ;;
  *) die "usage: $0 install|up|down|status" ;;
esac
