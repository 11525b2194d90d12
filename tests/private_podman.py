"""A private podman for tests: its own configuration, image storage and state, removed afterwards.

Everything lives in one temporary directory: containers.conf (runc as the runtime, no default
ulimits: the two settings this machine kind needs, see ../shared/README.md), storage.conf (the
image store and run state), podman's temporary files and network configuration. CONTAINERS_CONF and
CONTAINERS_STORAGE_CONF point podman at them, so the machine's own configuration is neither read
nor changed. The store is bind-mounted on itself as a shared mount, as a systemd host's `/` is
(this machine's is private): a pod's Bidirectional mount propagation needs that to reach the node
and from there the other containers. `close()` removes every pod, container, volume and image,
undoes the bind mount and deletes the directory.

A Debian base image is made without an image registry: debootstrap from the Debian archive apt
uses here (its address read from apt's own sources), imported with `podman import`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shardfs.service.status import shardfs_mounts

NEEDED = ("podman", "runc", "debootstrap", "catatonit")
SETUP = "tools/container/setup.sh"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing_parts() -> str | None:
    """Why podman cannot run containers here, or None."""
    if os.getuid() != 0:
        return "needs root (rootful podman, debootstrap)"
    for name in NEEDED:
        if not shutil.which(name):
            return f"{name} is missing: run {SETUP}"
    if not os.path.exists("/dev/fuse"):
        return "needs /dev/fuse"
    if debian_archive() is None:
        return "no Debian archive in /etc/apt/sources.list.d/*.sources to debootstrap from"
    return None


def debian_archive(sources_dir: str = "/etc/apt/sources.list.d") -> str | None:
    """The first `URIs:` of a deb822 stanza of apt's sources that serves bookworm itself."""
    for path in sorted(Path(sources_dir).glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(line.split(":", 1) for line in stanza.splitlines()
                          if ":" in line and not line.startswith(("#", " ")))
            if "bookworm" in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
    return None


class Podman:
    def __init__(self, home: Path):
        self.home = home
        self.store = home / "store"
        self.store.mkdir(parents=True)
        (home / "containers.conf").write_text(
            "[containers]\ndefault_ulimits = []\n"
            f'[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
            f'tmp_dir = "{home}/tmp"\n'
            f'[network]\nnetwork_config_dir = "{home}/net.d"\n')
        (home / "storage.conf").write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = "{self.store}"\nrunroot = "{home}/run"\n')
        self.env = {**os.environ, "CONTAINERS_CONF": str(home / "containers.conf"),
                    "CONTAINERS_STORAGE_CONF": str(home / "storage.conf")}
        subprocess.run(["mount", "--bind", str(self.store), str(self.store)], check=True)
        subprocess.run(["mount", "--make-rshared", str(self.store)], check=True)

    def __call__(self, *args: str, check: bool = True, timeout: float = 300, text: bool = True,
                 **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(["podman", *args], check=False, env=self.env, capture_output=True, text=text,
                              timeout=timeout, **kwargs)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def import_debian(self, name: str, workdir: Path) -> str:
        """A minimal Debian 12 image (`name`), debootstrapped into `workdir` (removed again)."""
        rootfs = workdir / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), debian_archive()],
                       check=True, capture_output=True, timeout=900)
        try:
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            # an imported tree has no configuration: give it the PATH a Debian image has
            self("import", "--change", f"ENV {PATH_ENV}", "-", name, stdin=tar.stdout, text=False)
            assert tar.wait() == 0
        finally:
            shutil.rmtree(rootfs)
        return name

    def mounts(self) -> list[str]:
        """shardfs mounts on this node below our store (a pod's, propagated out)."""
        return [m for m, _ in shardfs_mounts() if m.startswith(str(self.store) + "/")]

    def close(self) -> None:
        for what in (("pod", "rm", "--all", "--force"), ("rm", "--all", "--force"),
                     ("volume", "rm", "--all", "--force"), ("rmi", "--all", "--force")):
            self(*what, check=False)
        for mnt in self.mounts():  # a daemon that did not unmount (it failed, or was killed)
            subprocess.run(["umount", "--lazy", mnt], check=False)
        subprocess.run(["umount", "--recursive", "--lazy", str(self.store)], check=False)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    """A private podman for a test module, closed (everything it made removed) after it."""
    p = Podman(tmp_path_factory.mktemp("podman"))
    try:
        yield p
    finally:
        p.close()
