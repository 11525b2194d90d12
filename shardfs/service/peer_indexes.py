"""One index build per job: nodes mounting unindexed shards together build each index once.

The owner of a shard (owner.py, placed from the shards found and their sizes, before any index
exists) builds its index; the other nodes ask the owner for it over the peer protocol (signed
and checksummed as shard bytes are), check that it describes the shard as they see it (size,
mtime, --columns and the fingerprint of its bytes) and keep it in their cache directory, so the
next mount finds it. A node whose owner is down (not answering for START_WAIT), slow (no index
within the storage deadline, deadline.TIMEOUT) or has none builds the index itself.

Each index is built at most once per node (``_once``): peers' requests for a shard being built
wait on that build, and are answered from the start, before this node's view is assembled.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor

from shardfs.formats.datafile import Columns
from shardfs.index import index_file
from shardfs.index import store as index_store
from shardfs.index.shard_index import ShardIndex
from shardfs.storage import deadline
from shardfs.storage.base import is_url
from shardfs.storage.peers import owner
from shardfs.storage.peers.client import PeerFailure
from shardfs.view.dataset import build_pool, builds_in_threads

log = logging.getLogger(__name__)

BUILDERS = 2  # threads building indexes a peer asked for that were not built ahead
START_WAIT = min(5.0, deadline.TIMEOUT / 3)  # an owner not answering this soon after we ask may be starting too
RETRY_S = 0.05  # a refused connection costs next to nothing: asked again soon, so no node waits long past its owner's start


def _load_or_build(path: str, index_dir: str | None, columns: Columns) -> tuple[str | None, bool]:
    """(where the index is stored, whether it was built): on a worker process, nothing big sent back."""
    ix, how = index_store.load_or_build(path, index_dir, False, columns)
    return ix.stored_at, how.startswith("built")


class IndexSharing:
    def __init__(self, net, index_dir: str | None, columns: Columns, workers: int):
        self.net, self.index_dir, self.columns, self.workers = net, index_dir, columns, workers
        self.built = 0  # indexes this node built (for itself and its peers)
        self.received = 0
        self._paths: dict[str, str] = {}  # digest -> local shard path
        self._digests: dict[str, str] = {}
        self._builds: dict[str, Future] = {}  # digest -> Future of where its index is stored (or None)
        self._known: Future = Future()  # done once the shards found are placed
        self._lock = threading.Lock()
        self._builder = ThreadPoolExecutor(BUILDERS, thread_name_prefix="shardfs-index-for-peers")
        net.server.serve_indexes(self.index_file)

    # ---- before the view -----------------------------------------------------------------

    def know(self, paths: list[str]) -> None:
        """The shards found (local ones: their identity from a stat) and their owners, placed as
        every node places them. Peers' index requests wait until this is done."""
        digests, sizes = [], []
        for path in paths:
            if is_url(path):
                continue  # an object store's shards: indexes beside the objects serve every node
            try:
                st = os.stat(path)
            except OSError:
                continue  # its index job says why
            digest = owner.digest(owner.identity(path, st.st_size, st.st_mtime_ns))
            self._paths[digest], self._digests[path] = path, digest
            digests.append(digest)
            sizes.append(st.st_size)
        self.net.assign(digests, sizes)
        self._known.set_result(None)

    def build_owned(self, progress=None) -> None:
        """Build the indexes of the shards this node owns that have none, in parallel, before
        anything else: the other nodes are asking for them."""
        todo = [(digest, path) for path, digest in self._digests.items()
                if self.net.owner_of(digest) == self.net.me and self._current(path) is None]
        if not todo:
            return
        log.info("building the indexes of %d shards this node owns (the other nodes ask for them)", len(todo))
        in_threads = all(builds_in_threads(path) for _, path in todo)
        with build_pool(len(todo), max(1, self.workers), in_threads) as pool:
            futures = [self._build_once(digest, path, pool) for digest, path in todo]  # (a peer may have asked first)
            for done, future in enumerate(futures, 1):
                self._wait(future, None)
                if progress is not None:
                    progress(done, len(futures))

    def _current(self, path: str) -> ShardIndex | None:
        try:
            return index_store.find_current(path, self.index_dir, self.columns)
        except OSError:
            return None

    def _build_once(self, digest: str, path: str, pool: Executor) -> Future:
        """Where the shard's index is stored, once built (or found) on ``pool``; a shard asked for
        again gets the first build's Future. Chained outside the lock: a build that has already
        ended runs its callback at once, on this thread, and that callback takes the lock too
        (a mount hung that way, in CI)."""
        with self._lock:
            found = self._builds.get(digest)
            if found is not None:
                return found
            out = self._builds[digest] = Future()
        out.set_running_or_notify_cancel()
        try:
            built = pool.submit(_load_or_build, path, self.index_dir, self.columns)
        except RuntimeError as exc:  # the pool is shut down (an unmount under way)
            out.set_exception(exc)
            return out

        def done(f: Future) -> None:
            try:
                stored, new = f.result()
            except BaseException as exc:  # noqa: BLE001 - cancelled too (an unmount): the waiters get it
                out.set_exception(exc)
                return
            with self._lock:
                self.built += new
            out.set_result(stored)

        built.add_done_callback(done)
        return out

    def _once(self, digest: str, path: str) -> Future:
        return self._build_once(digest, path, self._builder)

    # ---- the owner's side ------------------------------------------------------------------

    def index_file(self, digest: str) -> Future:
        """The bytes of the shard's index file, or None (not a shard of ours, or no index to be
        had): a Future, never waited for here (the peer server awaits it)."""
        out: Future = Future()
        out.set_running_or_notify_cancel()  # a request that gives up cannot cancel it under the build

        def answer(_) -> None:
            path = self._paths.get(digest)
            shard = self.net.shard(digest)
            if path is None and shard is not None and not shard.remote:
                path = shard.path  # a shard added by a rescan
            if path is None:
                out.set_result(None)
                return
            self._once(digest, path).add_done_callback(lambda built: out.set_result(self._read(built)))

        self._known.add_done_callback(answer)
        return out

    @staticmethod
    def _read(built: Future) -> bytes | None:
        if built.exception() is not None or built.result() is None:
            return None
        try:
            with open(built.result(), "rb") as f:
                return f.read()
        except OSError:
            return None

    # ---- the other nodes' side ------------------------------------------------------------------

    def fetch(self, path: str) -> ShardIndex | None:
        """The shard's index from its owner, checked and kept; None: ours to build (we own it,
        or its owner is down, slow, has none or sent one that does not describe our shard)."""
        digest = self._digests.get(path)
        began = time.monotonic()
        # (its owner down: the new one, once the owners without it are made)
        peer = self.net.owner_of(digest, until=began + deadline.TIMEOUT) if digest is not None else None
        if peer is None:
            return None
        if peer == self.net.me:  # it fell to us (a peer down): built once here, for us and whoever asks us
            self._wait(self._once(digest, path), deadline.TIMEOUT)
            return None  # (the index job finds it stored)
        while (left := began + deadline.TIMEOUT - time.monotonic()) > 0.5:
            try:
                data = self.net.client.fetch_index(peer, digest, left)
            except PeerFailure as exc:
                # A job's nodes start within seconds of each other: an owner that does not answer
                # at first is taken to be starting still, and asked again for a while.
                if exc.down and time.monotonic() < began + START_WAIT:
                    time.sleep(RETRY_S)
                    continue
                log.info("%s: no index from %s (%s); building it here", path, peer, exc)
                return None
            return self._checked(path, peer, data)
        return None

    @staticmethod
    def _wait(future: Future, seconds: float | None) -> None:
        try:
            future.result(timeout=seconds)
        except Exception:  # noqa: BLE001 - the index job builds it and says why
            pass

    def _checked(self, path: str, peer: str, data: bytes) -> ShardIndex | None:
        try:
            index = index_file.load(io.BytesIO(data))
            why = index_store.received_describes(index, path, self.columns)
        except (OSError, ValueError) as exc:
            why = str(exc)
        if why is not None:
            log.warning("%s: the index %s sent does not serve this shard (%s); building it here", path, peer, why)
            return None
        with self._lock:
            self.received += 1
        return index_store.keep_received(index, path, self.index_dir)

    def close(self) -> None:
        self._builder.shutdown(wait=False, cancel_futures=True)
