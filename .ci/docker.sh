#!/bin/sh
# Make a fresh Debian bookworm machine ready for `--backend docker`: Debian's docker.io, a running dockerd, and a
# local base image (no registry is needed: the base is a debootstrapped bookworm, see docker/make-base.sh).
#
#   .ci/docker.sh [BASE_NAME]        (as root; idempotent: every step is skipped when already done)
#
# Env: STACKFARM_DOCKERD_LOG (default /var/log/stackfarm-dockerd.log), MIRROR (passed to make-base.sh).
set -eu

BASE=${1:-stackfarm-base:bookworm}
LOG=${STACKFARM_DOCKERD_LOG:-/var/log/stackfarm-dockerd.log}
HERE=$(cd "$(dirname "$0")/.." && pwd)
# Debian's client (20.10) has BuildKit built in; a newer `docker` earlier on PATH may lack the buildx plugin.
DOCKER=/usr/bin/docker

step() { printf '[docker.sh] %s\n' "$*"; }
die() { printf '[docker.sh] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts dockerd)"

missing=""
command -v dockerd >/dev/null 2>&1 && [ -x "$DOCKER" ] || missing="docker.io"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
    step "install$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    apt-get install -y -qq --no-install-recommends $missing ca-certificates >/dev/null
else
    step "docker.io and debootstrap are installed"
fi

if "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    step "dockerd answers ($("$DOCKER" version --format '{{.Server.Version}}'))"
else
    if [ -d /run/systemd/system ]; then
        step "start dockerd (systemd)"
        systemctl start docker
    else
        step "start dockerd in the background (log: $LOG)"
        # setsid: dockerd outlives this script and the CI step's process group.
        setsid dockerd >"$LOG" 2>&1 </dev/null &
    fi
    i=0
    until "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; do
        i=$((i + 1))
        if [ "$i" -ge 60 ]; then
            tail -n 20 "$LOG" >&2 2>/dev/null || true
            die "dockerd did not answer within 60s"
        fi
        sleep 1
    done
    step "dockerd answers ($("$DOCKER" version --format '{{.Server.Version}}'), storage $("$DOCKER" info --format '{{.Driver}}'))"
fi

DOCKER="$DOCKER" "$HERE/docker/make-base.sh" "$BASE"
step "ready: base $BASE; run cells with --backend docker (STACKFARM_DOCKER=$DOCKER)"
