"""The Python API: a live mount for the length of a ``with`` block.

    import shardfs
    from torchvision import datasets

    with shardfs.mounted("/lustre/proj/imagenet-shards", cache_size="32G") as root:
        train = datasets.ImageFolder(f"{root}/train")
        ...

The mount is made by the same ``shardfs mount`` command line users run (a detached daemon
that is live before this returns) and is always unmounted on exit, exceptions included.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from shardfs.errors import ShardfsError
from shardfs.service.mount import force_unmount


class MountError(ShardfsError, RuntimeError):
    """``shardfs mount`` failed; the message is what it printed, exit_code its status."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def mount_command(sources: list[str], mountpoint: str, options: dict) -> list[str]:
    """The ``shardfs mount`` command line for keyword options (cache_size="32G" -> --cache-size 32G)."""
    cmd = [sys.executable, "-m", "shardfs", "mount", *sources, mountpoint]
    for key, value in options.items():
        if value is None or key == "storage_options":  # through the environment: see mounted()
            continue
        if key == "allow_other":
            cmd += ["-o", "allow_other"] if value else []
        elif key == "auto_unmount":
            cmd += [] if value else ["--no-auto-unmount"]
        elif key == "peers":
            cmd += ["--peers", value if isinstance(value, str) else ",".join(value) or "off"]
        elif isinstance(value, bool):
            raise TypeError(f"option {key}={value!r}: only allow_other and auto_unmount are flags")
        else:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


@contextlib.contextmanager
def mounted(src: str | os.PathLike | list, mountpoint: str | os.PathLike | None = None,
            **options) -> Iterator[str]:
    """Mount ``src`` (a shard directory, file or glob, or a list of them) and yield the mount's path.

    Without ``mountpoint`` a private temporary directory is used and removed afterwards.
    Options are those of ``shardfs mount``: cache_size, disk_cache, disk_cache_size, prefetch, loaders, index_dir,
    workers, log_file, layout ("plain" or "imagefolder"), class_names, allow_other (bool),
    auto_unmount (bool, default True), storage_options (a dict of fsspec options for
    s3:// and http(s):// sources), peers (a list of "HOST:PORT" of the nodes serving shards to
    each other, [] for none) and peer_self (this node's entry).
    """
    sources = [os.fspath(s) for s in (src if isinstance(src, list | tuple) else [src])]
    with mountpoint_or_temporary(mountpoint) as path, serving(sources, path, options) as root:
        yield root


@contextlib.contextmanager
def mountpoint_or_temporary(mountpoint: str | os.PathLike | None) -> Iterator[str]:
    """``mountpoint``, or a private temporary directory removed afterwards."""
    if mountpoint is not None:
        yield os.fspath(mountpoint)
        return
    path = tempfile.mkdtemp(prefix="shardfs-")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(path)  # rmdir, never rmtree: nothing inside a mount is ever deleted


@contextlib.contextmanager
def serving(sources: list[str], path: str, options: dict, fuse_fd: int | None = None) -> Iterator[str]:
    """``shardfs mount`` at ``path`` until the block ends. fuse_fd: /dev/fuse mounted at ``path``
    already (userns.py): the daemon serves it as /dev/fd/N, and we close our copy once it has it."""
    env = None
    if options.get("storage_options"):  # credentials: never on a command line
        from shardfs.storage.remote import OPTIONS_ENV

        env = {**os.environ, OPTIONS_ENV: json.dumps(options["storage_options"])}
    try:
        done = subprocess.run(mount_command(sources, path if fuse_fd is None else f"/dev/fd/{fuse_fd}", options),
                              capture_output=True, text=True, env=env, pass_fds=() if fuse_fd is None else (fuse_fd,))
    finally:
        if fuse_fd is not None:
            os.close(fuse_fd)  # the daemon's is the only one left: if it dies, the mount answers ENOTCONN
    if done.returncode != 0:
        raise MountError(done.stderr.strip() or f"shardfs mount exited with status {done.returncode}",
                         done.returncode if done.returncode > 0 else 1)
    try:
        yield path
    finally:
        force_unmount(path, direct=fuse_fd is not None)
