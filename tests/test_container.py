"""The container image (tools/container/Containerfile) and the pod example (tools/container/pod.yaml),
built and run with a private podman (tests/private_podman.py) on a Debian base image made here: the mount
inside the container, the pod's training container reading the shardfs container's mount. Every
file is compared by sha256 with the source. They take minutes (debootstrap, apt and pip in the
build): slow-marked. Needs root, podman, runc, debootstrap, catatonit (tools/container/setup.sh) and
the network the build uses (Debian's archive, PyPI)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from benchlib import sample
from benchlib.cli import REPO
from private_podman import missing_parts, podman  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.skipif(missing_parts() is not None, reason=str(missing_parts()))]

CONTAINERFILE = f"{REPO}/tools/container/Containerfile"
POD_YAML = f"{REPO}/tools/container/pod.yaml"
BASE = "localhost/shardfs-test-base:bookworm"
IMAGE = "localhost/shardfs-test:latest"
FUSE = ("--device", "/dev/fuse", "--cap-add", "SYS_ADMIN")
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module")
def image(podman, tmp_path_factory):
    """The image built from the Containerfile on a debootstrapped Debian 12 base."""
    start = time.monotonic()
    podman.import_debian(BASE, tmp_path_factory.mktemp("debootstrap"))
    based = time.monotonic()
    # The host's trust store: pip inside trusts what the host trusts (a proxy's own CA included).
    podman("build", "--network", "host", "-f", CONTAINERFILE, "--build-arg", f"BASE={BASE}",
           "-v", f"{HOST_CA}:/run/host-ca.pem:ro", "--build-arg", "PIP_CERT=/run/host-ca.pem",
           "-t", IMAGE, REPO, timeout=1500)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    print(f"base image {based - start:.0f} s, build {time.monotonic() - based:.0f} s, image {size / 1e6:.0f} MB")
    return IMAGE


def sha256_lines(output: str) -> dict[str, str]:
    """`sha256sum ./PATH` output -> {PATH: digest}."""
    found = {}
    for line in output.splitlines():
        digest, path = line.split(maxsplit=1)
        found[path.removeprefix("./")] = digest
    return found


def test_image_runs_a_command_over_the_mount(podman, image, tar_shards, sample_tree):
    done = podman("run", "--rm", "--network", "none", *FUSE, "-v", f"{tar_shards}:/shards:ro", image,
                  "run", "/shards", "/data", "--", "sh", "-c", "cd /data && find . -type f -exec sha256sum {} +")
    assert sha256_lines(done.stdout) == sample.digests(str(sample_tree))


def test_run_in_the_image_is_read_only_passes_the_status_and_leaves_nothing(podman, image, tar_shards):
    script = ("shardfs run /shards /data -- sh -c 'touch /data/new; exit 7'; echo \"status $?\"; "
              "echo \"mounts $(grep -c fuse.shardfs /proc/self/mountinfo)\"; "
              "if [ -e /data ]; then echo 'mountpoint left'; else echo 'mountpoint removed'; fi")
    done = podman("run", "--rm", "--network", "none", *FUSE, "-v", f"{tar_shards}:/shards:ro",
                  "--entrypoint", "sh", image, "-c", script)
    assert "touch: cannot touch '/data/new': Read-only file system" in done.stderr
    assert done.stdout.splitlines()[-3:] == ["status 7", "mounts 0", "mountpoint removed"]


def test_image_holds_the_daemon_not_the_training_stack(podman, image):
    done = podman("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                  "command -v gcc; python3 -c 'import torch'; command -v python3; shardfs --version", check=False)
    assert "No module named 'torch'" in done.stderr
    # no compiler; `python3` is the base image's own (a training image as BASE keeps its torch)
    assert done.stdout.splitlines()[:-1] == ["/usr/bin/python3"]
    assert done.stdout.splitlines()[-1].startswith("shardfs ")


def test_pod_example_training_container_reads_the_mount(podman, image, tar_shards, sample_tree, tmp_path):
    pod = yaml.safe_load(Path(POD_YAML).read_text())
    name = pod["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    daemon, train = containers["shardfs"], containers["train"]
    # Ours: the shards, the images, and a training command that prints what it read. The shardfs
    # container (command, privileges, propagation, probe) and the wait for the mount stay as written.
    volumes["shards"]["hostPath"]["path"] = str(tar_shards)
    daemon["image"], train["image"] = image, BASE
    pod["spec"]["restartPolicy"] = "Never"
    example = train["args"][0]
    train["args"][0] = example.replace("exec python train.py --data /dataset/mnt/train",
                                       "cd /dataset/mnt && find . -type f -exec sha256sum {} +")
    assert train["args"][0] != example
    played = tmp_path / "pod.yaml"
    played.write_text(yaml.safe_dump(pod))

    podman("kube", "play", "--network", "none", str(played))
    try:
        assert podman("wait", f"{name}-train").stdout.strip() == "0"
        assert sha256_lines(podman("logs", f"{name}-train").stdout) == sample.digests(str(sample_tree))
        # podman runs no readiness probes: run the example's, and see it can say no
        probe = daemon["readinessProbe"]["exec"]["command"]
        assert podman("exec", f"{name}-shardfs", *probe, check=False).returncode == 0
        assert podman("exec", f"{name}-shardfs", "shardfs", "status", "/dataset", check=False).returncode != 0
        assert podman.mounts()  # the mount propagated out to the node's copy of the volume
        # Stopping the pod (SIGTERM) unmounts, on the node too: no stale mount left behind.
        podman("pod", "stop", name)
        assert podman.mounts() == []
        assert "unmounted /dataset/mnt" in podman("logs", f"{name}-shardfs").stderr
    finally:
        podman("kube", "down", str(played), check=False)
