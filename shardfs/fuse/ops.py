"""FUSE operations over a dataset view: lookups and listings from the Tree, reads through
view.reader and the RAM cache, figures through an xattr of the root; every write is EROFS.

Tuned for immutable data (see README, "How it works"): ``open`` and ``flush``
answer ENOSYS so the kernel stops sending OPEN/RELEASE/FLUSH (zero-message
opens) and keeps the page cache across opens; long entry/attr/negative timeouts
mean a second epoch never asks the daemon for a lookup. So ``read`` gets no file
handle and works from the path.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from typing import Callable

from shardfs.index import names
from shardfs.formats import format_for
from shardfs.formats.base import Kind, ShardFormatError
from shardfs.fuse.lib import load as load_fuse
from shardfs.view.dataset import Dataset
from shardfs.view.reader import Fetcher, read_member
from shardfs.storage.base import ShardIOError
from shardfs.fuse import statbuf
from shardfs.fuse.stats import STATS_XATTR, Stats
from shardfs.view.tree import inode_number

log = logging.getLogger(__name__)
fuse = load_fuse()

TIMEOUT = 24 * 3600.0  # shards are immutable while mounted
# A name looked up while missing is asked again after this long: files of shards added by a
# rescan (SIGHUP) become visible under names a reader had already tried.
NEGATIVE_TIMEOUT = 60.0
XATTR_SHARD = "user.shardfs.shard"
XATTR_OFFSET = "user.shardfs.offset"
XATTR_FORMAT = "user.shardfs.format"


_SYMLINK = int(Kind.SYMLINK)  # a plain int: enum attribute lookups cost on every getattr
CAP_READDIRPLUS, CAP_READDIRPLUS_AUTO = 1 << 13, 1 << 14  # libfuse3's FUSE_CAP_READDIRPLUS(_AUTO)


class Listing:
    """One directory's entries, addressable by position without building the ones skipped."""

    def __init__(self, fs: "ShardFS", view: Dataset, node: int):
        self.fs, self.view = fs, view
        tree = view.tree
        self.dir = node - 1
        self.subdirs, self.files = tree.children(node)
        self.parent = tree.dir_id[names.parent_of(tree.dirs[self.dir].path)]

    def __len__(self) -> int:
        return 2 + len(self.subdirs) + len(self.files)

    def entry_into(self, index: int, st) -> bytes:
        """The name of entry ``index``; its attributes go into ``st`` (a struct stat, all written)."""
        view, fs = self.view, self.fs
        if index < 2:
            fs._dir_into(st, view, self.dir if index == 0 else self.parent)
            return b"." if index == 0 else b".."
        index -= 2
        if index < len(self.subdirs):
            d = self.subdirs[index]
            fs._dir_into(st, view, d)
            return names.basename_of(view.tree.dirs[d].path)
        m = int(self.files[index - len(self.subdirs)])
        fs._member_into(st, view, m)
        return names.basename_of(view.tree.name(m))


def _erofs(*_args, **_kwargs):
    raise fuse.FuseOSError(errno.EROFS)


class ShardFS(fuse.Operations):
    use_ns = True

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
        self.uid, self.gid = os.getuid(), os.getgid()
        self._reported: set[str] = set()

    # ---- lifecycle -------------------------------------------------------

    def init_with_config(self, conn, config) -> None:
        if config is not None:
            config.entry_timeout = TIMEOUT
            config.attr_timeout = TIMEOUT
            config.negative_timeout = NEGATIVE_TIMEOUT
            config.kernel_cache = 1
            config.use_ino = 1
        if conn is not None and conn.capable & CAP_READDIRPLUS:
            # Always readdirplus: with "auto" (libfuse's default) the kernel asks for attributes
            # only in the first batch of a large directory, and each file listed after it costs
            # a LOOKUP when opened (measured: 1,602 extra requests in a 20,000-file epoch).
            conn.want = (conn.want | CAP_READDIRPLUS) & ~CAP_READDIRPLUS_AUTO
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

    # Attributes go straight into libfuse's struct stat (glue.PlusFUSE.getattr_fuse_3 and its
    # listings) in one call: a dict per request and mfusepy's generic copy of it cost more than
    # finding the member.

    def _dir_into(self, st, view: Dataset, d: int) -> None:
        info = view.tree.dirs[d]
        statbuf.fill(st, inode_number(info.path), stat.S_IFDIR | info.mode, view.tree.dir_nlink[d], self.uid,
                     self.gid, 4096, 8, int(info.mtime * 1e9))

    def _member_into(self, st, view: Dataset, m: int) -> None:
        tree = view.tree
        col = tree.col
        size = col.size[m]
        kind = stat.S_IFLNK if col.kind[m] == _SYMLINK else stat.S_IFREG
        statbuf.fill(st, inode_number(tree.name(m)), kind | col.mode[m], 1, self.uid, self.gid, size,
                     (size + 511) // 512, int(col.mtime[m] * 1e9))

    def stat_into(self, path: bytes, st) -> None:
        """getattr: ``path`` as libfuse gives it (bytes, leading slash); all of ``st`` is written."""
        self.stats.op("getattr")
        view = self.view
        node = self._node(view, path)
        if view.tree.is_dir(node):
            self._dir_into(st, view, node - 1)
        else:
            self._member_into(st, view, view.tree.member(node))

    def getattr(self, path: str, fh=None) -> dict:
        """mfusepy's form (registers the operation); the mount itself calls stat_into."""
        st = fuse.c_stat()
        self.stat_into(os.fsencode(path), st)
        return {name: getattr(st, name) for name in ("st_ino", "st_mode", "st_nlink", "st_size", "st_blocks",
                                                      "st_uid", "st_gid")} | {
            "st_mtime": st.st_mtimespec.tv_sec * 10**9 + st.st_mtimespec.tv_nsec}

    def listing(self, path: str) -> Listing:
        self.stats.op("readdir")
        view = self.view
        node = self._node(view, os.fsencode(path))
        if not view.tree.is_dir(node):
            raise fuse.FuseOSError(errno.ENOTDIR)
        return Listing(self, view, node)

    def readdir(self, path: str, fh):
        """Only for mfusepy's registration: PlusFUSE.readdir_fuse_3 serves listings."""
        listing = self.listing(path)
        for index in range(len(listing)):
            yield os.fsdecode(listing.entry_into(index, fuse.c_stat())), None, 0

    def readlink(self, path: str) -> str:
        self.stats.op("readlink")
        view = self.view
        node = self._node(view, os.fsencode(path))
        target = None if view.tree.is_dir(node) else view.tree.symlinks.get(view.tree.member(node))
        if target is None:
            raise fuse.FuseOSError(errno.EINVAL)
        return os.fsdecode(target)

    def statfs(self, path: str) -> dict:
        self.stats.op("statfs")
        tree = self.view.tree
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": (tree.total_size + 4095) // 4096,
            "f_bfree": 0,
            "f_bavail": 0,
            "f_files": tree.ndirs + tree.nfiles,
            "f_ffree": 0,
            "f_favail": 0,
            "f_namemax": 255,
        }

    def listxattr(self, path: str) -> list[str]:
        self.stats.op("listxattr")
        view = self.view
        node = self._node(view, os.fsencode(path))
        if view.tree.is_dir(node):
            return [STATS_XATTR] if node == 1 else []
        return [XATTR_SHARD, XATTR_OFFSET, XATTR_FORMAT]

    def figures(self) -> dict:
        """Everything `shardfs stats` shows: request counters and the daemon's figures."""
        return {**self.stats.snapshot(), **self.extra_stats()}

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        self.stats.op("getxattr")
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
                return format_for(shard.path).name.encode()
        raise fuse.FuseOSError(errno.ENODATA)

    # ---- data ------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        raise fuse.FuseOSError(errno.ENOSYS)  # zero-message opens, see module docstring

    def flush(self, path: str, fh: int) -> int:
        raise fuse.FuseOSError(errno.ENOSYS)

    def read(self, path: bytes, size: int, offset: int, fh) -> bytes | memoryview:
        """``path`` as libfuse gives it (bytes, leading slash): glue.PlusFUSE.read calls this."""
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

    # ---- every write answers EROFS (the mount is also "ro") --------------

    chmod = chown = create = link = mkdir = mknod = rename = rmdir = _erofs
    setxattr = removexattr = symlink = truncate = unlink = utimens = write = _erofs
