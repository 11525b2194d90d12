"""The Python half of the FUSE operations (fusepy's API, paths as libfuse gives them): reads
the compiled loop (``server``, ``lowlevel/*.c``) cannot answer from the RAM cache, symlinks,
xattrs (the figures through an xattr of the root), and the mount's start and end. Lookups,
attributes, listings, ioctl, statfs and every write (EROFS) are answered in C.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from typing import Callable

from shardfs.formats.ctar import format_name
from shardfs.formats.base import ShardFormatError
from shardfs.fuse.lib import load as load_fuse
from shardfs.view.dataset import Dataset
from shardfs.view.reader import Fetcher, read_member
from shardfs.storage.base import ShardIOError
from shardfs.fuse.stats import STATS_XATTR, Stats

log = logging.getLogger(__name__)
fuse = load_fuse()

TIMEOUT = 24 * 3600.0  # shards are immutable while mounted
# A name looked up while missing is asked again after this long: files of shards added by a
# rescan (SIGHUP) become visible under names a reader had already tried.
NEGATIVE_TIMEOUT = 60.0
XATTR_SHARD = "user.shardfs.shard"
XATTR_OFFSET = "user.shardfs.offset"
XATTR_FORMAT = "user.shardfs.format"


class ShardFS(fuse.Operations):
    def __init__(
        self,
        view: Dataset,
        cache: Fetcher,
        stats: Stats,
        extra_stats: Callable[[], dict] = dict,
        on_ready: Callable[[], None] | None = None,
        on_destroy: Callable[[], None] | None = None,
    ):
        # ``view`` (tree + shards) is replaced whole by a rescan; every operation reads
        # ``self.view`` once, so it works on one consistent view.
        self.view, self.cache, self.stats = view, cache, stats
        self.extra_stats = extra_stats
        self.on_ready, self.on_destroy = on_ready, on_destroy
        self._reported: set[str] = set()

    # ---- lifecycle -------------------------------------------------------

    def init(self, path: str) -> None:
        if self.on_ready is not None:
            self.on_ready()

    def destroy(self, path: str) -> None:
        if self.on_destroy is not None:
            self.on_destroy()

    # ---- helpers ---------------------------------------------------------

    @staticmethod
    def _node(view: Dataset, path: bytes) -> int:
        """Node id of a path as libfuse gives it (leading slash); ENOENT if absent."""
        node = view.tree.lookup(path[1:])
        if not node:
            raise fuse.FuseOSError(errno.ENOENT)
        return node

    # ---- metadata --------------------------------------------------------

    def readlink(self, path: str) -> str:
        view = self.view
        node = self._node(view, os.fsencode(path))
        target = None if view.tree.is_dir(node) else view.tree.symlinks.get(view.tree.member(node))
        if target is None:
            raise fuse.FuseOSError(errno.EINVAL)
        return os.fsdecode(target)

    def listxattr(self, path: str) -> list[str]:
        view = self.view
        node = self._node(view, os.fsencode(path))
        if view.tree.is_dir(node):
            return [STATS_XATTR] if node == 1 else []
        return [XATTR_SHARD, XATTR_OFFSET, XATTR_FORMAT]

    def figures(self) -> dict:
        """Everything `shardfs stats` shows: request counters and the daemon's figures."""
        return {**self.stats.snapshot(), **self.extra_stats()}

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        view = self.view
        node = self._node(view, os.fsencode(path))
        tree = view.tree
        if node == 1 and name == STATS_XATTR:
            return json.dumps(self.figures()).encode()
        if not tree.is_dir(node):
            m = tree.member(node)
            shard = view.shards[tree.col.shard[m]]
            if name == XATTR_SHARD:
                return os.fsencode(shard.path)
            if name == XATTR_OFFSET:
                return str(tree.col.offset[m]).encode()
            if name == XATTR_FORMAT:
                return format_name(shard).encode()
        raise fuse.FuseOSError(errno.ENODATA)

    # ---- data ------------------------------------------------------------

    def read(self, path: bytes, size: int, offset: int, fh) -> bytes | memoryview:
        """A read the compiled loop could not answer from the RAM cache (``path``: bytes, leading slash)."""
        view = self.view
        node = self._node(view, path)
        if view.tree.is_dir(node):
            raise fuse.FuseOSError(errno.EISDIR)
        try:
            data = read_member(view, self.cache, view.tree.member(node), offset, size)
        except (ShardIOError, ShardFormatError) as exc:
            self.stats.error()
            self._report(os.fsdecode(path), exc)
            raise fuse.FuseOSError(errno.EIO) from None
        self.stats.served(len(data))
        return data

    def _report(self, path: str, exc: Exception) -> None:
        # Shard-level failures are logged by Shard; format errors (a bad block) once per message.
        msg = str(exc)
        if isinstance(exc, ShardFormatError) and msg not in self._reported and len(self._reported) < 1000:
            self._reported.add(msg)
            log.error("%s: %s; answering EIO", path, msg)
