"""The mount: libfuse's low-level session run by the compiled loop (``_lowlevel``), answering
per-file requests from the view's table and handing misses and control to the operations."""

from __future__ import annotations

import logging
import os
import signal

from shardfs.fuse import _lowlevel, table
from shardfs.fuse.lib import libfuse
from shardfs.fuse.ops import NEGATIVE_TIMEOUT, TIMEOUT, ShardFS
from shardfs.view.dataset import Dataset

log = logging.getLogger(__name__)


class Server:
    def __init__(self, ops: ShardFS, slots: table.Slots, mountpoint: str, options: list[str],
                 first_table: _lowlevel.Table | None = None):
        """Mounts at once (``options`` as for mount -o); ``loop`` then serves until unmounted.
        ``first_table``: the table of ``ops.view``, if made already (a saved view's)."""
        self.ops, self.slots = ops, slots
        ops.stats.add_source(self.counts)
        # SHARDFS_PUSH_ON_OPEN=0 turns off putting a member looked up just now in the page cache with
        # the isatty of its open() (see lowlevel/requests.c, push_member): for comparisons.
        push = os.environ.get("SHARDFS_PUSH_ON_OPEN", "1") != "0"
        # SHARDFS_READDIRPLUS=0: listings without attributes (the kernel makes no inode per entry
        # listed; each file opened later costs a LOOKUP): for comparisons of what listings cost.
        plus = os.environ.get("SHARDFS_READDIRPLUS", "1") != "0"
        first_table = table.build(ops.view, slots) if first_table is None else first_table
        self.session = _lowlevel.Session(ops, first_table, mountpoint, ",".join(options),
                                         TIMEOUT, NEGATIVE_TIMEOUT, push=push, readdirplus=plus)

    def loop(self, max_threads: int, max_idle_threads: int) -> int:
        """Serve until unmounted (0) or stopped by SIGTERM/SIGINT (the signal's number)."""
        # libfuse installs its stop handlers only where the default is set: Python's own SIGINT
        # handler would never run while this thread is in C.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        log.info("%s", libfuse().describe(max_threads, max_idle_threads))
        return self.session.loop(max_threads, max_idle_threads)

    def swap(self, view: Dataset) -> None:
        """Serve ``view`` from now on (a rescan): the kernel forgets the listings and attributes
        it cached of every directory of the old and the new view."""
        old = self.ops.view
        for shard in view.shards:
            if shard.broken:
                self.slots.forget(shard)
        self.session.set_table(table.build(view, self.slots))
        self.ops.view = view
        failed = self.session.invalidate(sorted(set(table.directory_inos(old)) | set(table.directory_inos(view))))
        if failed:
            log.warning("the kernel kept its cached listing of %d directories after the rescan", failed)

    def counts(self) -> dict:
        return self.session.counts()
