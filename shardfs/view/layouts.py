"""Layouts: how the members of a shard are presented. ``plain`` shows them as stored;
``imagefolder`` turns WebDataset samples into ``<class>/<key>.<ext>`` for torchvision's
ImageFolder. Dataset files (Parquet, Arrow, HDF5: formats/datafile.py) show each row as
``SPLIT/CLASS/NAME.EXT`` in either layout, CLASS by the same rule (see ``datafile_view``).

A WebDataset sample is the run of members sharing a key: the member path up to the first
"." of its last component (``train/n0144_1.jpg`` -> ``train/n0144_1``, as webdataset's
``base_plus_ext`` splits it). Its label is the integer in its ``.cls`` member, read when
the index was built (labels.py), so this view costs no shard read. The view is a new
ShardIndex with renamed members whose offsets and sizes are the original ones: reads go
to the same bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from shardfs.errors import UsageError
from shardfs.index import names
from shardfs.formats import DATA_FORMATS
from shardfs.formats.base import Kind
from shardfs.index.shard_index import ShardIndex, path_hash
from shardfs.index.labels import UNPARSABLE

LAYOUTS = ("plain", "imagefolder")
# What torchvision's ImageFolder accepts (IMG_EXTENSIONS), compared in lower case like it does.
IMAGE_EXTS = (b"jpg", b"jpeg", b"png", b"ppm", b"bmp", b"pgm", b"tif", b"tiff", b"webp")
SHOWN_KEYS = 3  # per kind of problem; the rest are counted


@dataclass
class Skipped:
    """Samples left out of the view, by reason: a count and the first few keys (a compact log)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    used: set[int] = field(default_factory=set)  # labels of the samples kept

    def add(self, reason: str, shard: str, key: bytes) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < SHOWN_KEYS:
            shown.append(f"{shard}:{names.show(key)}")

    def lines(self) -> list[str]:
        return [f"imagefolder layout: {n} sample{'s' if n != 1 else ''} {reason}, left out "
                f"(e.g. {', '.join(self.examples[reason])})" for reason, n in self.counts.items()]


@dataclass
class ImageFolderLayout:
    classes: list[str] | None = None  # label i is classes[i]; None: the label, zero-padded
    width: int = 1  # zero-padding of labels without a class list (set from every shard's labels)

    def folder(self, label: int) -> str | None:
        """The class folder of a label, None when the label is out of range."""
        if label < 0 or label == UNPARSABLE:
            return None
        if self.classes is None:
            return f"{label:0{self.width}d}"
        return self.classes[label] if label < len(self.classes) else None

    def notes(self, used: set[int]) -> list[str]:
        """Why ImageFolder's class indices would differ from the .cls labels, if they would."""
        notes = []
        if self.classes is not None and self.classes != sorted(self.classes):
            notes.append("imagefolder layout: the class names are not in sorted order, so torchvision's "
                         "ImageFolder numbers the classes differently from the .cls labels (map them with "
                         "dataset.class_to_idx)")
        count = len(self.classes) if self.classes is not None else max(used, default=-1) + 1
        missing = [i for i in range(count) if i not in used]
        if missing:  # ImageFolder sees no folder for them: the classes after shift down
            shown = ", ".join(str(self.folder(i)) for i in missing[:SHOWN_KEYS])
            notes.append(f"imagefolder layout: {len(missing)} of {count} classes have no sample ({shown}"
                         f"{', ...' if len(missing) > SHOWN_KEYS else ''}), so ImageFolder's class indices "
                         "differ from the .cls labels after the first of them")
        return notes


def label_width(indexes: list[ShardIndex]) -> int:
    """Digits of the largest valid label in any shard: one width for every class folder, so that
    their sorted order is the numeric order (ImageFolder's class index = the label)."""
    top = max((int(ix.cls_value.max()) for ix in indexes if len(ix.cls_value)), default=0)
    return len(str(max(top, 0)))


def split_key(name: bytes) -> tuple[bytes, bytes] | None:
    """(key, extension) as webdataset's ``base_plus_ext`` splits a member name; None without one."""
    cut = name.rfind(b"/") + 1
    dot = name.find(b".", cut)
    if dot <= cut:  # no extension, or a name starting with "." (webdataset skips both)
        return None
    return name[:dot], name[dot + 1 :]


def imagefolder(ix: ShardIndex, layout: ImageFolderLayout, shard: str, skipped: Skipped) -> ShardIndex:
    """The imagefolder view of one shard's index; skipped samples are added to ``skipped``."""
    label_of = dict(zip(ix.cls_member.tolist(), ix.cls_value.tolist()))
    samples: dict[bytes, list] = {}  # key -> [image member, image extension, .cls member]
    ends = ix.name_end.tolist()
    files = (ix.kind == Kind.FILE).tolist()
    start = 0
    for m, end in enumerate(ends):  # a plain loop over bytes: the hot path at mount (2.5M members for ImageNet)
        name, start = ix.names[start:end], end
        if not files[m]:
            continue
        cut = name.rfind(b"/") + 1  # split_key, inlined
        dot = name.find(b".", cut)
        if dot <= cut:
            continue  # not part of any sample (webdataset skips it too)
        key, ext = name[:dot], name[dot + 1 :]
        sample = samples.get(key)
        if sample is None:
            sample = samples[key] = [None, None, None]
        low = ext.lower()
        if low == b"cls":
            sample[2] = m
        elif sample[0] is None and low in IMAGE_EXTS:
            sample[0], sample[1] = m, ext

    chosen: list[int] = []
    paths: list[bytes] = []
    parent: list[int] = []
    folders: dict[int, tuple[bytes, int]] = {}  # label -> (b"<class>/", directory id)
    for key, (image, ext, cls) in samples.items():
        if image is None:
            skipped.add("without an image member", shard, key)
            continue
        if cls is None:
            skipped.add("without a .cls label", shard, key)
            continue
        label = label_of.get(cls, UNPARSABLE)  # unread (too large): not a label either
        if label == UNPARSABLE:
            skipped.add("with a .cls that is not an integer", shard, key)
            continue
        folder = folders.get(label)
        if folder is None:
            name = layout.folder(label)
            if name is None:
                skipped.add("with a label out of range", shard, key)
                continue
            folder = folders[label] = (name.encode("utf-8", "surrogateescape") + b"/", len(folders))
            skipped.used.add(label)
        chosen.append(image)
        paths.append(folder[0] + key[key.rfind(b"/") + 1 :] + b"." + ext)
        parent.append(folder[1])
    dirs = [prefix[:-1] for prefix, _id in folders.values()]
    return _renamed(ix, np.array(chosen, dtype=np.int64), paths, np.array(parent, dtype=np.uint32), dirs)


def _renamed(ix: ShardIndex, members: np.ndarray, paths: list[bytes], parent: np.ndarray,
             dirs: list[bytes]) -> ShardIndex:
    """``ix`` restricted to ``members``, renamed to ``paths`` (in ``dirs[parent]``); the data they
    point at is unchanged."""
    sparse = {new: ix.sparse[old] for new, old in enumerate(members.tolist()) if old in ix.sparse} if ix.sparse else {}
    return ShardIndex(
        format=ix.format, shard_size=ix.shard_size, shard_mtime_ns=ix.shard_mtime_ns,
        names=b"".join(paths), name_end=np.cumsum([len(p) for p in paths], dtype=np.int64),
        kind=ix.kind[members], offset=ix.offset[members], size=ix.size[members], mode=ix.mode[members],
        mtime=ix.mtime[members], hash=np.array([path_hash(p) for p in paths], dtype=np.uint64),
        parent=parent, dirs=dirs, warnings=ix.warnings, error=ix.error, stored_at=ix.stored_at, sparse=sparse,
    )


def datafile_view(ix: ShardIndex, layout: ImageFolderLayout, shard: str, skipped: Skipped,
                  placed: Counter, notes: list[str]) -> ShardIndex:
    """A dataset file's rows (``SPLIT/NAME.EXT``, a label each) as ``SPLIT/CLASS/NAME.EXT``: CLASS
    from the class names the file carries, else the layout's (``--class-names``), else the label
    zero-padded. ``placed`` counts rows by (split, class folder, label)."""
    classes = ix.classes
    if classes is not None:
        try:
            for name in classes:
                check_component(name, f"{shard}: class")
            if len(set(classes)) != len(classes):
                raise UsageError(f"{shard}: a class name appears twice")
        except UsageError as exc:
            notes.append(f"{exc}; its rows are shown under their labels")
            classes = None
    own = layout if classes is None else ImageFolderLayout(classes)
    chosen, paths, parent, dirs = [], [], [], {}
    label_of = dict(zip(ix.cls_member.tolist(), ix.cls_value.tolist()))
    for m in range(len(ix)):
        name = ix.name(m)
        label = label_of.get(m, UNPARSABLE)
        folder = own.folder(label)
        if folder is None:
            skipped.add("with a label out of range", shard, name)
            continue
        split = names.parent_of(name)
        folder_path = (split + b"/" if split else b"") + folder.encode("utf-8", "surrogateescape")
        chosen.append(m)
        paths.append(folder_path + b"/" + names.basename_of(name))
        parent.append(dirs.setdefault(folder_path, len(dirs)))
        placed[(split, folder, label)] += 1
    return _renamed(ix, np.array(chosen, dtype=np.int64), paths, np.array(parent, dtype=np.uint32), list(dirs))


def mismatches(placed: Counter) -> list[str]:
    """Rows whose ImageFolder class index (its folder's place among its split's sorted folders)
    is not their stored label, counted (the class names are unsorted, a class has no row, or
    files disagree on the names)."""
    folders: dict[bytes, set[str]] = {}
    for split, folder, _ in placed:
        folders.setdefault(split, set()).add(folder)
    index = {split: {f: i for i, f in enumerate(sorted(fs))} for split, fs in folders.items()}
    differ = sum(n for (split, folder, label), n in placed.items() if index[split][folder] != label)
    if not differ:
        return []
    return [f"dataset files: {differ} of {sum(placed.values())} rows have an ImageFolder class index other than "
            "their stored label (unsorted class names or classes without rows: map with dataset.class_to_idx)"]


def apply(layout: ImageFolderLayout | None, shard_names: list[str], indexes: list[ShardIndex]):
    """(the indexes as the layout shows them, problem lines). ``None`` is the plain layout, in
    which dataset files still show their rows in class folders."""
    data = [ix.format in DATA_FORMATS for ix in indexes]
    if layout is None and not any(data):
        return indexes, []
    folders = layout if layout is not None else ImageFolderLayout()
    if folders.classes is None:  # never narrower than before: a rescan does not rename every folder
        folders.width = max(folders.width, label_width(indexes))
    skipped, placed, notes = Skipped(), Counter(), []
    views = []
    for shard, ix, is_data in zip(shard_names, indexes, data):
        if is_data:
            views.append(datafile_view(ix, folders, shard, skipped, placed, notes))
        else:
            views.append(ix if layout is None else imagefolder(ix, layout, shard, skipped))
    if layout is not None and not all(data):
        notes = layout.notes(skipped.used) + notes
    return views, notes + mismatches(placed) + skipped.lines()


def from_options(name: str, class_names: str | None) -> ImageFolderLayout | None:
    """The layout a mount asks for (``--layout``, ``--class-names FILE``)."""
    if name not in LAYOUTS:
        raise UsageError(f"unknown layout {name!r} (one of {', '.join(LAYOUTS)})")
    if name == "plain":
        if class_names:
            raise UsageError("--class-names applies to --layout imagefolder only")
        return None
    return ImageFolderLayout(read_classes(class_names) if class_names else None)


def read_classes(path: str) -> list[str]:
    """Class names, one per line: label i is line i (counting from 0)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    while lines and not lines[-1].strip():
        lines.pop()
    classes = [line.strip() for line in lines]
    for n, name in enumerate(classes, 1):
        check_component(name, f"{path}:{n}: class")
    if len(set(classes)) != len(classes):
        raise UsageError(f"{path}: a class name appears twice")
    return classes


def check_component(name: str, what: str) -> str:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise UsageError(f"{what} {name!r} cannot be a folder name")
    return name
