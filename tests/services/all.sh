#!/usr/bin/env bash
# all.sh -- start / stop every real service the integration tests use, and write their settings
# to $ENV_FILE for pytest (tests/conftest.py reads it).
# Usage (root): all.sh up | down
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ENV_FILE=${ENV_FILE:-/tmp/rlctl-test-services.env}
case "${1:-up}" in
  up)
    "$HERE/slurm.sh" up
    "$HERE/sshd.sh" up
    "$HERE/prometheus.sh" up
    "$HERE/netsite.sh" up
    cat >"$ENV_FILE" <<CONF
RLCTL_TEST_SLURM_CONF=/tmp/rlctl-test-slurm/slurm.conf
RLCTL_TEST_SSH_HOST=127.0.0.1
RLCTL_TEST_SSH_PORT=2222
RLCTL_TEST_SSH_KEY=/tmp/rlctl-test-sshd/id_ed25519
RLCTL_TEST_SSH_KNOWN_HOSTS=/tmp/rlctl-test-sshd/known_hosts
RLCTL_TEST_PROMETHEUS_URL=http://127.0.0.1:19090
RLCTL_TEST_PROMETHEUS_TARGETS=/tmp/rlctl-test-prometheus/targets
RLCTL_TEST_NETSITE_NETNS=rlctl-site-b
RLCTL_TEST_NETSITE_DEV=rlsiteb0
RLCTL_TEST_NETSITE_HOST=10.250.0.2
RLCTL_TEST_NETSITE_HOSTS=10.250.0.2,10.250.0.3,10.250.0.4
RLCTL_TEST_NETSITE_GATEWAY=10.250.0.1
RLCTL_TEST_NETSITE_KNOWN_HOSTS=/tmp/rlctl-test-netsite/known_hosts
RLCTL_TEST_NETSITE_RATE_MBIT=100
CONF
    echo "[all.sh] services up; settings in $ENV_FILE" >&2
    ;;
  down)
    "$HERE/netsite.sh" down || true
    "$HERE/prometheus.sh" down || true
    "$HERE/sshd.sh" down || true
    "$HERE/slurm.sh" down || true
    rm -f "$ENV_FILE"
    ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
