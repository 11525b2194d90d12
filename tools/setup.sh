#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) for shardfs: FUSE, the package, test and demo extras.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
if ! command -v fusermount3 >/dev/null || ! ldconfig -p | grep -q libfuse3.so.3; then
    apt-get update -qq
    # fuse3/libfuse3-3: the mount; tar/attr: tests; squashfuse/squashfs-tools: benchmark baseline
    apt-get install -y -qq fuse3 libfuse3-3 tar attr squashfuse squashfs-tools >/dev/null
fi

PIP="python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore"
# torchvision wheels are built against the matching CUDA torch (runs on CPU); pin the pair.
if ! python3 -c "import torch, torchvision" 2>/dev/null; then
    $PIP "torch==2.14.0" "torchvision==0.29.2"
fi
$PIP -e ".[test,torch]"
