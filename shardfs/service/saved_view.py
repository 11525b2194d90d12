"""The daemon's use of saved views (view/snapshot.py): the mount's view and table from the saved
view when it is current, else made as before and saved for the next mount once mounted.

Only for mounts whose view is made from local index files alone: not with peers (indexes from
the owners), not for remote shards (``Dataset.index_ids`` is None for them), and never at a
rescan (SIGHUP makes its view the normal way and writes nothing).
"""

from __future__ import annotations

import logging
import os
import threading

from shardfs.view import snapshot
from shardfs.view.dataset import Dataset

log = logging.getLogger(__name__)


def saved_views_wanted() -> bool:
    """SHARDFS_SAVED_VIEW=0: mounts neither map nor write saved views (where the index or cache
    directory has no room for a file about the size of the indexes, or to measure the merge)."""
    return os.environ.get("SHARDFS_SAVED_VIEW", "1") != "0"


class SavedView:
    def __init__(self, sources: list[str], index_dir: str | None, layout, columns):
        """Before the view is made: the layout's key is the options' (a merge widens its labels)."""
        self.index_dir = index_dir
        self.path, self.key = snapshot.place(sources, index_dir, layout, columns)
        self._derived: dict | None = None  # the table's arrays to be saved
        self._mapped = None  # the table made from the saved view's arrays (load)
        self._view: Dataset | None = None
        self._table = None
        self._writer: threading.Thread | None = None

    def load(self, found: list[str], slots) -> Dataset | None:
        """The saved view, its table made at once (``slots``: the mount's): arrays that do not hold
        together behind good checksums (an edited file, a writer's bug) are refused by the table's
        checks, and the view is merged from the indexes instead (None)."""
        from shardfs.fuse import table  # (loads libfuse: imported by the daemon only once it mounts)

        got = snapshot.load(self.path, self.key, found, self.index_dir)
        if got is None:
            return None
        view, derived = got
        try:
            self._mapped = table.from_saved(view, slots, derived)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            log.info("saved view %s not used: its arrays do not hold together (%s); merging the indexes and "
                     "saving it again", self.path, exc)
            return None
        log.info("view mapped from %s, saved by an earlier mount", self.path)
        return view

    def table(self, view: Dataset, slots):
        """The request loop's table of ``view``: the one made from the saved arrays when ``view`` was loaded."""
        from shardfs.fuse import table

        if self._mapped is not None:
            mapped, self._mapped = self._mapped, None
            return mapped
        if view.index_ids is None:
            return table.build(view, slots)
        built, self._derived = table.build_keeping(view, slots)
        self._view, self._table = view, built  # (held while saved: the children are its memory)
        return built

    def save_in_background(self) -> None:
        """Once mounted (the mount does not wait for it): write the view made for the next mount."""
        if self._derived is None or self._view is None:
            return
        # The table goes with the arrays (a rescan may swap it out meanwhile); the thread lets go of
        # both once done.
        args = (self._view, self._derived, self._table)
        self._view = self._derived = self._table = None
        self._writer = threading.Thread(target=self._save, args=args, name="shardfs-save-view", daemon=True)
        self._writer.start()

    def _save(self, view: Dataset, derived: dict, held) -> None:
        try:
            snapshot.save(self.path, self.key, view, derived, self.index_dir)
        except Exception:  # never the mount's end: the next mount merges the indexes again
            log.exception("saving the view in %s failed", self.path)

    def wait(self) -> None:
        """At the end: a view being written is finished (not left as a temporary file)."""
        if self._writer is not None:
            self._writer.join()
