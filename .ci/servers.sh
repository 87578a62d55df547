#!/bin/sh
# Start the shared stores the tests use for real, on 127.0.0.1 only:
#   - the verdict store: Debian's nginx with its WebDAV module (.ci/store-nginx.conf) at
#     http://127.0.0.1:8808/store (stackfarm.store: `--store URL`);
#   - an OCI registry: Debian's docker-registry (the distribution registry 2.8, .ci/registry.yml) at
#     127.0.0.1:5000.
#
#   .ci/servers.sh [--env FILE]     (as root; idempotent: a server that already answers is left as it is)
#
# One line per step. With --env, FILE gets `export STACKFARM_TEST_STORE=...` / `export
# STACKFARM_TEST_REGISTRY=...` for each server that answers (source it before `nox -s tests`); a server that
# does not answer is not exported, says why here, and its tests skip with a reason. Exit status: 0 when both
# answer, 1 otherwise. Env: STACKFARM_SERVERS_DIR (default /var/lib/stackfarm-servers: data and logs).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${STACKFARM_SERVERS_DIR:-/var/lib/stackfarm-servers}
STORE_URL=http://127.0.0.1:8808/store
REGISTRY=127.0.0.1:5000
ENV_FILE=""
if [ "${1:-}" = "--env" ]; then
    ENV_FILE=${2:?--env needs a file}
fi

step() { printf '[servers.sh] %s\n' "$*"; }
fail() { printf '[servers.sh] error: %s\n' "$*" >&2; }

# Whether a URL answers 200 within 2 s (python3 is on every machine that runs CI; curl may not be).
answers() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2).close()' "$1" \
        >/dev/null 2>&1
}

# Wait up to 30 s for a URL; on time-out print the log's tail.
wait_for() {
    i=0
    until answers "$1"; do
        i=$((i + 1))
        if [ "$i" -ge 30 ]; then
            fail "$1 did not answer within 30 s; the end of $2:"
            tail -n 15 "$2" >&2 2>/dev/null || true
            return 1
        fi
        sleep 1
    done
}

if [ "$(id -u)" != 0 ]; then
    fail "run as root (it installs nginx and docker-registry and starts them)"
    exit 1
fi

missing=""
command -v nginx >/dev/null 2>&1 || missing="nginx"
command -v docker-registry >/dev/null 2>&1 || missing="$missing docker-registry"
if [ -n "$missing" ]; then
    step "install$missing"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null; } \
        || fail "apt-get install$missing failed"
else
    step "nginx and docker-registry are installed"
fi

start_store() {
    if answers "$STORE_URL/"; then
        step "verdict store answers at $STORE_URL"
        return 0
    fi
    command -v nginx >/dev/null 2>&1 || { fail "no nginx: the verdict store is not started"; return 1; }
    prefix=$STATE/nginx
    mkdir -p "$prefix/data/store" "$prefix/tmp"
    chown -R www-data:www-data "$prefix/data" "$prefix/tmp"
    if ! nginx -t -q -p "$prefix/" -c "$HERE/store-nginx.conf" 2>"$prefix/check.log"; then
        fail "nginx refuses $HERE/store-nginx.conf:"
        cat "$prefix/check.log" >&2
        return 1
    fi
    step "start nginx (verdict store: $prefix/data/store, log: $prefix/error.log)"
    # nginx puts itself in the background (daemon on): it outlives this script.
    nginx -p "$prefix/" -c "$HERE/store-nginx.conf" || { fail "nginx did not start"; return 1; }
    wait_for "$STORE_URL/" "$prefix/error.log" || return 1
    step "verdict store answers at $STORE_URL"
}

start_registry() {
    if answers "http://$REGISTRY/v2/"; then
        step "registry answers at $REGISTRY"
        return 0
    fi
    command -v docker-registry >/dev/null 2>&1 || { fail "no docker-registry: the registry is not started"; return 1; }
    data=$STATE/registry
    log=$STATE/registry.log
    mkdir -p "$data"
    run_as=""
    if id docker-registry >/dev/null 2>&1; then
        chown -R docker-registry "$data"
        run_as="runuser -u docker-registry --"
    fi
    step "start docker-registry (data: $data, log: $log)"
    # setsid: the registry outlives this script and the CI step's process group.
    # shellcheck disable=SC2086 # $run_as is a command prefix, empty or three words
    REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY=$data setsid $run_as docker-registry serve "$HERE/registry.yml" \
        >"$log" 2>&1 </dev/null &
    wait_for "http://$REGISTRY/v2/" "$log" || return 1
    step "registry answers at $REGISTRY"
}

status=0
mkdir -p "$STATE"
if start_store; then store_ok=1; else store_ok=0; status=1; fi
if start_registry; then registry_ok=1; else registry_ok=0; status=1; fi

if [ -n "$ENV_FILE" ]; then
    : >"$ENV_FILE"
    [ "$store_ok" = 1 ] && echo "export STACKFARM_TEST_STORE=$STORE_URL" >>"$ENV_FILE"
    [ "$registry_ok" = 1 ] && echo "export STACKFARM_TEST_REGISTRY=$REGISTRY" >>"$ENV_FILE"
    step "wrote $ENV_FILE ($(wc -l <"$ENV_FILE") variable(s))"
fi
exit "$status"
