"""The ways of serving one dataset that the benchmarks compare, each mounted fresh per round.

A ``Data`` names the same files in every form: a plain directory, tar shards, a squashfs image.
Every method gives the ImageFolder root (``<mount>/train`` or the plain directory's ``train``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

from .mounts import Mounted, Mounts


@dataclasses.dataclass
class Data:
    plain: str  # a directory holding <sub>/<class>/<file>
    shard_dir: str  # tar shards of the same files, stored as <sub>/<class>/<file>
    work: str  # mountpoints (work/mnt/<method>) and logs (work/logs)
    squashfs: str | None = None  # mksquashfs of `plain`
    index_dir: str | None = None  # shardfs --index-dir (default: beside the shards)
    sub: str = "train"

    def shards(self) -> list[str]:
        return sorted(os.path.join(self.shard_dir, n) for n in os.listdir(self.shard_dir) if n.endswith(".tar"))


class Method:
    name = ""
    fuse = True
    mount_timeout = 3600.0  # seconds a daemon started as our child may take to mount (then: failed)

    def __init__(self, data: Data, options: tuple[str, ...] = ()):
        self.data, self.options = data, list(options)

    def available(self) -> str | None:
        """Why this method cannot run here (None: it can)."""
        return None

    def forget_indexes(self) -> None:
        """Remove the method's indexes, so that the next mount builds them."""

    def mount(self, mounts: Mounts) -> Mounted | None:
        raise NotImplementedError

    def root(self, m: Mounted | None) -> str:
        return os.path.join(m.mnt if m else self.data.plain, self.data.sub)

    def _mnt(self) -> str:
        return os.path.join(self.data.work, "mnt", self.name)

    def _log(self) -> str:
        os.makedirs(os.path.join(self.data.work, "logs"), exist_ok=True)
        return os.path.join(self.data.work, "logs", f"{self.name}.log")


class Plain(Method):
    name, fuse = "plain", False

    def mount(self, mounts: Mounts) -> None:
        return None


class ShardFS(Method):
    def __init__(self, data: Data, name: str = "shardfs", options: tuple[str, ...] = ()):
        super().__init__(data, options)
        self.name = name

    def forget_indexes(self) -> None:
        for d in filter(None, (self.data.shard_dir, self.data.index_dir)):
            for n in os.listdir(d) if os.path.isdir(d) else ():
                if n.endswith(".shardfs-idx"):
                    os.unlink(os.path.join(d, n))

    def mount(self, mounts: Mounts) -> Mounted:
        opts = ["--index-dir", self.data.index_dir] if self.data.index_dir else []
        return mounts.shardfs([self.data.shard_dir], self._mnt(), *opts, *self.options, log=self._log())


class Ratarmount(Method):
    name = "ratarmount"

    @staticmethod
    def exe() -> str | None:
        # The script beside our interpreter first (a pyenv shim would add a bash layer).
        mine = os.path.join(os.path.dirname(sys.executable), "ratarmount")
        return mine if os.path.exists(mine) else shutil.which("ratarmount")

    def available(self) -> str | None:
        return None if self.exe() else f"ratarmount not installed ({sys.executable} -m pip install ratarmount)"

    def forget_indexes(self) -> None:
        for p in self.data.shards():
            if os.path.exists(p + ".index.sqlite"):
                os.unlink(p + ".index.sqlite")

    def mount(self, mounts: Mounts) -> Mounted:
        return mounts.spawn([self.exe(), "-f", *self.options, *self.data.shards(), self._mnt()], self._mnt(),
                            self._log(), self.mount_timeout)


class SquashfuseLL(Method):
    name, mount_timeout = "squashfuse_ll", 600.0

    def available(self) -> str | None:
        if not shutil.which("squashfuse_ll"):
            return "squashfuse_ll not installed (apt-get install squashfuse)"
        return None if self.data.squashfs else "no squashfs image (mksquashfs missing or failed)"

    def mount(self, mounts: Mounts) -> Mounted:
        return mounts.spawn(["squashfuse_ll", "-f", self.data.squashfs, self._mnt()], self._mnt(), self._log(),
                            self.mount_timeout)


class KernelSquashfs(Method):
    """The kernel's own squashfs driver on a loop device: what a site with root would use."""

    name, fuse = "squashfs-kernel", False

    def available(self) -> str | None:
        if os.geteuid() != 0:
            return "needs root (mount -o loop)"
        return None if self.data.squashfs else "no squashfs image (mksquashfs missing or failed)"

    def mount(self, mounts: Mounts) -> Mounted:
        return mounts.kernel(["mount", "-t", "squashfs", "-o", "loop,ro", self.data.squashfs, self._mnt()],
                             self._mnt())


BASELINES = {"plain": Plain, "ratarmount": Ratarmount, "squashfuse_ll": SquashfuseLL,
             "squashfs-kernel": KernelSquashfs}


def make_methods(names: list[str], data: Data, shardfs_variants: dict[str, list[str]],
                 options: dict[str, list[str]] | None = None) -> tuple[dict, dict]:
    """The methods asked for that can run here, and why the others cannot; ``options``: extra
    command-line options of a baseline's daemon (``{"ratarmount": [...]}``)."""
    methods, skipped = {}, {}
    for name in names:
        if name in shardfs_variants:
            m = ShardFS(data, name, shardfs_variants[name])
        elif name in BASELINES:
            m = BASELINES[name](data, (options or {}).get(name, ()))
        else:
            raise ValueError(f"unknown method {name!r} (known: {', '.join([*shardfs_variants, *BASELINES])})")
        why = m.available()
        if why:
            skipped[name] = why
        else:
            methods[name] = m
    return methods, skipped
