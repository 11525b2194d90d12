#!/usr/bin/env bash
# Install what building and running the shardfs container image needs on a Debian host (as root;
# idempotent): podman to build and run it, runc as its runtime (podman's default crun cannot
# set rlimits or use hybrid cgroups on some hosts), debootstrap to make a Debian base image
# without an image registry (tests/test_container.py), uidmap/slirp4netns/fuse-overlayfs for
# podman's rootless mode. Changes no configuration: the tests bring their own containers.conf.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null \
    || ! command -v catatonit >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends podman runc debootstrap uidmap slirp4netns \
        fuse-overlayfs containernetworking-plugins iptables catatonit >/dev/null
fi
