#!/bin/sh
# Build a local Debian base image for stackfarm cells, for machines that reach no container registry.
#
#   docker/make-base.sh [NAME] [SUITE] [ROOTFS_DIR]
#
# NAME defaults to stackfarm-base:bookworm, SUITE to bookworm (whose python3 is 3.11, the default python axis).
# The image holds python3 with pip and venv, and the host's CA bundle: behind a TLS-intercepting proxy pip inside
# the build reaches the index only with the proxy's CA. Idempotent: an existing NAME is left alone.
# With ROOTFS_DIR the debootstrap tree is kept there too, for `docker import` on an air-gapped runner.
# Env: MIRROR (a Debian mirror URL), CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt), DOCKER (the CLI).
set -eu

NAME=${1:-stackfarm-base:bookworm}
SUITE=${2:-bookworm}
KEEP=${3:-}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
DOCKER=${DOCKER:-docker}

say() { printf 'make-base: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

if "$DOCKER" image inspect "$NAME" >/dev/null 2>&1; then
    say "$NAME exists; nothing to do"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root; run as root (or sudo)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install -y debootstrap"
"$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "no docker engine answers ($DOCKER version failed)"
[ -r "$CA_BUNDLE" ] || die "CA bundle $CA_BUNDLE is not readable; set CA_BUNDLE"

work=$(mktemp -d "${TMPDIR:-/tmp}/stackfarm-base.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
rootfs="$work/rootfs"

start=$(date +%s)
say "debootstrap $SUITE (minbase + python3, pip, venv) from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
    tail -n 20 "$work/debootstrap.log" >&2
    die "debootstrap failed (log above)"
}
# The host bundle goes in after ca-certificates, which would otherwise rewrite it without the host's extra CAs.
cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
# A smaller image: package lists and caches are not needed at run time.
rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"* "$rootfs/tmp/"*

say "import as $NAME"
tar -C "$rootfs" -c . | "$DOCKER" import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'CMD ["/bin/bash"]' \
    - "$NAME" >/dev/null
if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP"
    cp -a "$rootfs/." "$KEEP/"
    say "rootfs kept in $KEEP"
fi
say "done in $(( $(date +%s) - start ))s: $("$DOCKER" image inspect --format '{{.Size}}' "$NAME" | awk '{printf "%.0f MB", $1/1e6}')"
