#!/usr/bin/env bash
# tools.sh -- what the fault-injection suite needs besides the services (tests/services/all.sh): nft, to drop
# the inter-DC link's packets at both receivers and to redirect one port to a proxy (the kernel has nf_tables
# and NAT; tc here has neither netem nor a drop action). Usage (root): tools.sh
set -euo pipefail
log() { echo "[faults/tools.sh $(date +%T)] $*" >&2; }
[ "$(id -u)" = 0 ] || { log "ERROR: run as root"; exit 1; }
command -v nft >/dev/null && exit 0
log "apt-get install nftables"
timeout 300 apt-get update -qq
DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends nftables >/dev/null
command -v nft >/dev/null || { log "ERROR: nft missing after the install"; exit 1; }
