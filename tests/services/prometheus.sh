#!/usr/bin/env bash
# prometheus.sh -- a private Prometheus server (Debian package) for rlctl's metrics tests.
# It scrapes every target listed in $BASE/targets/*.json (file_sd: tests drop a file naming their
# controller's host:port, Prometheus picks it up at once), every second.
# Usage (root): prometheus.sh install | up | down | status
# Knobs: BASE=/tmp/rlctl-test-prometheus  PORT=19090
set -euo pipefail
BASE=${BASE:-/tmp/rlctl-test-prometheus}
PORT=${PORT:-19090}
log() { echo "[prometheus.sh $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

install() {
  command -v prometheus >/dev/null && return 0
  log "apt-get install prometheus"
  timeout 300 apt-get update -qq
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

ours() { [ -d "/proc/$1" ] && grep -qaF "$BASE" "/proc/$1/cmdline" 2>/dev/null; }
down() {
  if [ -f "$BASE/prometheus.pid" ]; then
    local p i; p=$(cat "$BASE/prometheus.pid")
    if ours "$p"; then
      kill -TERM "$p" 2>/dev/null || true
      for i in $(seq 1 40); do ours "$p" || break; sleep 0.25; done
      if ours "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
    fi
  fi
  rm -rf "$BASE"
}

up() {
  install
  down
  mkdir -p "$BASE/targets" "$BASE/data"
  cat >"$BASE/prometheus.yml" <<CONF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: rlctl
    file_sd_configs:
      - files: ['$BASE/targets/*.json']
        refresh_interval: 1s
CONF
  setsid nohup prometheus --config.file="$BASE/prometheus.yml" --storage.tsdb.path="$BASE/data" \
    --web.listen-address="127.0.0.1:$PORT" >"$BASE/prometheus.log" 2>&1 </dev/null &
  echo $! >"$BASE/prometheus.pid"
  local end=$((SECONDS + 60))
  until timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT" 2>/dev/null; do
    [ $SECONDS -lt $end ] || die "prometheus not listening: $(tail -5 "$BASE/prometheus.log")"; sleep 0.2
  done
  log "prometheus on 127.0.0.1:$PORT, targets in $BASE/targets/"
}

case "${1:-up}" in
  install) install ;;
  up) up ;;
  down) down ;;
  status) if [ -f "$BASE/prometheus.pid" ] && ours "$(cat "$BASE/prometheus.pid")"; then echo running; else echo "not running"; fi ;;
  *) die "usage: $0 install|up|down|status" ;;
esac
