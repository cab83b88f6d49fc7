#!/bin/sh
# Build a Python 3.11 base image from Debian's packages (bookworm: python3 3.11, pip, useradd)
# for machines that cannot pull python:3.11-slim from Docker Hub. Use it with
#   docker build --build-arg PYTHON_IMAGE=failslow-local/python:3.11 .
# Needs root, debootstrap and a Docker daemon. The host's CA bundle is copied in, so that pip
# works behind a TLS-intercepting proxy the host trusts.
set -eu
TAG=${1:-failslow-local/python:3.11}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
docker info >/dev/null 2>&1 || { echo "needs a running Docker daemon" >&2; exit 2; }
ROOTFS=$(mktemp -d)
trap 'rm -rf "$ROOTFS"' EXIT INT TERM
echo "debootstrap bookworm into $ROOTFS ($MIRROR) ..." >&2
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || { tail -20 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
ln -sf /usr/bin/python3 "$ROOTFS/usr/local/bin/python"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import \
    -c 'ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore' -c 'CMD ["python3"]' \
    - "$TAG" >/dev/null
echo "$TAG"
