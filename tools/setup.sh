#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) for shardfs: FUSE, the package, test and demo extras.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
have_nginx() { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; }
if ! command -v fusermount3 >/dev/null || ! ldconfig -p | grep -q libfuse3.so.3 || ! have_nginx; then
    apt-get update -qq
    # fuse3/libfuse3-3: the mount; tar/attr: tests; squashfuse/squashfs-tools: benchmark baseline;
    # nginx: the HTTP server of the remote-source tests and benchmark (started privately, never as a service)
    apt-get install -y -qq fuse3 libfuse3-3 tar attr squashfuse squashfs-tools nginx >/dev/null
fi

PIP="python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore"
# torchvision wheels are built against the matching CUDA torch (runs on CPU); pin the pair.
if ! python3 -c "import torch, torchvision" 2>/dev/null; then
    $PIP "torch==2.14.0" "torchvision==0.29.2"
fi
$PIP -e ".[test,torch,remote,bench]"

# mount(8) runs helpers with a fixed PATH (/usr/local/bin among it): make the commands
# reachable there, so fstab entries (type fuse.shardfs or shardfs) work.
scripts=$(python3 -c "import sysconfig; print(sysconfig.get_path('scripts'))")
for cmd in shardfs mount.shardfs; do
    if [ "$scripts" != /usr/local/bin ] && [ ! -e "/usr/local/bin/$cmd" ]; then
        ln -s "$scripts/$cmd" "/usr/local/bin/$cmd"
    fi
done
if ! command -v systemd-analyze >/dev/null; then
    apt-get install -y -qq systemd >/dev/null  # for the unit's verification test
fi
