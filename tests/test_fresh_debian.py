"""The README's first command, as printed, on fresh Debian 12 and 13 roots: the distribution's own
python3 (externally managed, PEP 668), no FUSE libraries, nothing installed by hand. Each root is
debootstrapped here from the Debian archive apt uses and run with a private podman
(tests/private_podman.py) with /dev/fuse passed in and SYS_ADMIN, the checkout copied in as a
clone would have it. Only the host's pip cache is shared (torch is gigabytes): never its packages.
Minutes each (debootstrap, apt, pip): slow-marked, run by .ci/run beside the container tests."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time

import pytest
from benchlib.cli import REPO
from private_podman import debian_archive, missing_parts, podman  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400),
              pytest.mark.skipif(missing_parts() is not None, reason=str(missing_parts()))]

HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
FUSE = ("--device", "/dev/fuse", "--cap-add", "SYS_ADMIN")


def readme_first_command() -> str:
    """The first line of the README's "Two commands" block, its comment left off."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"^## Two commands\n.*?```sh\n(.*?)```", text, flags=re.M | re.S)
    assert block, "README.md has no ## Two commands section with a sh block"
    return block.group(1).splitlines()[0].split("#")[0].strip()


def host_pip_cache() -> str:
    done = subprocess.run(["pip", "cache", "dir"], capture_output=True, text=True)
    path = done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else os.path.expanduser("~/.cache/pip")
    os.makedirs(path, exist_ok=True)
    return path


def copy_checkout(rootfs: str) -> str:
    """The checkout's files as a clone has them (tracked, and new ones git does not ignore: no venv,
    no build products) into rootfs/root/shardfs; returns the path inside the root."""
    listed = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout
    names = [n for n in listed.decode().split("\0") if n and os.path.lexists(os.path.join(REPO, n))]
    inside = os.path.join(rootfs, "root", "shardfs")
    os.makedirs(inside)
    pack = subprocess.Popen(["tar", "-C", REPO, "--null", "-T", "-", "-cf", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    unpack = subprocess.Popen(["tar", "-C", inside, "-xf", "-"], stdin=pack.stdout)
    pack.stdin.write("\0".join(names).encode())
    pack.stdin.close()
    assert unpack.wait() == 0 and pack.wait() == 0
    return "/root/shardfs"


@pytest.mark.parametrize("suite", ["bookworm", "trixie"], ids=["debian12", "debian13"])
def test_the_readme_first_command_runs_the_demo_on_a_fresh_debian(suite, podman, tmp_path):
    command = readme_first_command()
    assert "tools/setup.sh" in command and "tools/demo.py" in command, command
    rootfs = str(tmp_path / "rootfs")
    try:
        run_in_a_fresh_root(suite, command, rootfs, podman)
    finally:  # a root with torch in its venv is gigabytes: not left for pytest's kept temporaries
        shutil.rmtree(rootfs, ignore_errors=True)


def run_in_a_fresh_root(suite: str, command: str, rootfs: str, podman) -> None:
    started = time.monotonic()
    subprocess.run(["debootstrap", "--variant=minbase", suite, rootfs, debian_archive()], check=True,
                   capture_output=True, timeout=900)
    workdir = copy_checkout(rootfs)
    assert not os.path.exists(os.path.join(rootfs, "usr/bin/python3")), "a fresh root has no Python of its own yet"
    booted = time.monotonic()
    done = podman("run", "--rm", "--network", "host", *FUSE,
                  "-v", f"{host_pip_cache()}:/root/.cache/pip", "-v", f"{HOST_CA}:/run/host-ca.pem:ro",
                  "-e", "PIP_CERT=/run/host-ca.pem", "-e", "HOME=/root", "-e", "LANG=C.UTF-8",
                  "-e", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "-w", workdir, "--rootfs", rootfs, "bash", "-c", command, check=False, timeout=2000)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{command} failed on {suite} ({done.returncode}):\n{out[-6000:]}"
    print(f"{suite}: debootstrap {booted - started:.0f} s, `{command}` {time.monotonic() - booted:.0f} s")
    print(out[-1500:])
    ratio = re.search(r"mount/plain = ([0-9.]+)x", out)
    assert ratio and "unmounted." in out, out[-3000:]
    print(f"{suite}: demo mount/plain {ratio.group(1)}x")
    # the interpreter setup.sh found is the distribution's, externally managed (PEP 668) as on any
    # fresh Debian 12/13: pip ran in the venv only
    assert glob.glob(os.path.join(rootfs, "usr/lib/python3.*/EXTERNALLY-MANAGED"))
    # the venv is the distribution's python3's (not a copy of the host's interpreter)
    cfg = open(os.path.join(rootfs, "root/shardfs/.venv/pyvenv.cfg")).read()
    assert "home = /usr/bin" in cfg, cfg
    # the demo unmounted what it mounted: no FUSE mount of the container is left on the host
    with open("/proc/mounts") as f:
        assert rootfs not in f.read()
