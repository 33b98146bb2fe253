#!/usr/bin/env bash
# netsite.sh -- a remote "site" for the integration tests: one host in its own network namespace,
# linked to the root namespace (where SLURM and the operator run) by a veth pair shaped with tc tbf
# in both directions, with its own sshd on <site ip>:22.
#
#   root ns: $DEV 10.250.0.1/24 ══tbf $RATE══ eth0 10.250.0.2/24 in netns $NS (sshd :22)
#                                                  + 10.250.0.3, 10.250.0.4 (EXTRA_IPS): more hosts of the site
#
# Each extra address has its own sshd in its own mount namespace (private /tmp, /root): a host of the same
# site with storage of its own, behind the same shaped link (traffic between the site's hosts stays inside
# the namespace, unshaped, as inside a datacenter). Their host keys are in the same known_hosts file.
# Every byte between an agent on the site and the controller/trainer crosses the shaped link.
# The sshd (sshd.sh with NETNS set) accepts the loopback test sshd's client key (that one must be up first).
# It also runs in its own mount namespace with private, empty /tmp and /root (sshd.sh PRIVATE_DIRS): the
# site shares no filesystem with the operator (their /tmp/pytest-*/ job dirs, ~/.rlctl are not there), so
# agents on it can only read what `rlctl launch` staged to the site's work root.
# Usage (root): netsite.sh up | down | status
# Knobs: RATE=100mbit BURST=256k  SITE_PYTHON= the interpreter agents run there (default: the repo's .venv, else python3;
#        its install prefix is kept visible when it lives under /root)
set -euo pipefail
NS=${NS:-rlctl-site-b}
DEV=${DEV:-rlsiteb0}
GW_IP=${GW_IP:-10.250.0.1}
SITE_IP=${SITE_IP:-10.250.0.2}
EXTRA_IPS=${EXTRA_IPS:-10.250.0.3 10.250.0.4}
RATE=${RATE:-100mbit}
BURST=${BURST:-256k}
BASE=${BASE:-/tmp/rlctl-test-netsite}
SSHD_BASE=${SSHD_BASE:-/tmp/rlctl-test-sshd}
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[netsite.sh $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"

down() {
  local ip
  for ip in $EXTRA_IPS; do BASE=$BASE-$ip "$HERE/sshd.sh" down; done
  BASE=$BASE "$HERE/sshd.sh" down
  if [ -e "/run/netns/$NS" ]; then
    # processes still inside keep the namespace alive; they are ours (sshd, agents of a failed test)
    local sig p
    for sig in TERM KILL; do
      for p in $(ip netns pids "$NS" 2>/dev/null); do kill "-$sig" "$p" 2>/dev/null || true; done
      [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break
      sleep 0.5
    done
    ip netns del "$NS" 2>/dev/null || true
  fi
  ip link del "$DEV" 2>/dev/null || true
}

shape() { # shape <netns|-> <dev>: tbf on the device's egress
  local ns=$1 dev=$2
  if [ "$ns" = - ]; then tc qdisc add dev "$dev" root tbf rate "$RATE" burst "$BURST" latency 100ms
  else ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$RATE" burst "$BURST" latency 100ms; fi
}

up() {
  [ -f "$SSHD_BASE/id_ed25519.pub" ] || die "the loopback sshd ($SSHD_BASE) must be up first: its client key is reused"
  down
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip link add "$DEV" type veth peer name eth0 netns "$NS"
  ip addr add "$GW_IP/24" dev "$DEV"
  ip link set "$DEV" up
  ip -n "$NS" addr add "$SITE_IP/24" dev eth0
  ip -n "$NS" link set eth0 up
  shape - "$DEV"        # root ns -> site
  shape "$NS" eth0      # site -> root ns
  # the site's python: the interpreter the venv links to may live under /root (pyenv): kept visible
  local py keep=""
  py=${SITE_PYTHON:-$HERE/../../.venv/bin/python}
  [ -e "$py" ] || py=$(command -v python3)
  py=$(readlink -f "$py")
  case "$py" in /root/*) keep=$(cd "$(dirname "$py")/.." && pwd) ;; esac
  # the checkout itself (its .venv is the site's software) when a private dir would hide it, e.g. a CI clone in /tmp
  local repo
  repo=$(cd "$HERE/../.." && pwd -P)
  case "$repo" in /tmp/* | /root/*) keep="$keep $repo" ;; esac
  BASE=$BASE ADDR=$SITE_IP PORT=22 NETNS=$NS CLIENT_KEY=$SSHD_BASE/id_ed25519 PRIVATE_DIRS="/tmp /root" \
    PRIVATE_KEEP="$keep" "$HERE/sshd.sh" up
  local ip
  for ip in $EXTRA_IPS; do
    ip -n "$NS" addr add "$ip/24" dev eth0
    BASE=$BASE-$ip ADDR=$ip PORT=22 NETNS=$NS CLIENT_KEY=$SSHD_BASE/id_ed25519 PRIVATE_DIRS="/tmp /root" \
      PRIVATE_KEEP="$keep" "$HERE/sshd.sh" up
    cat "$BASE-$ip/known_hosts" >>"$BASE/known_hosts"
  done
  log "site $NS: $SITE_IP $EXTRA_IPS (sshd :22 each), link to $GW_IP shaped to $RATE both ways"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  status) if [ -e "/run/netns/$NS" ]; then echo "up: $(ip netns pids "$NS" | wc -l) processes"; else echo down; fi ;;
  *) die "usage: $0 up|down|status" ;;
esac
