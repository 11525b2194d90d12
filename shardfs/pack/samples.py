"""`shardfs pack --layout webdataset`: ImageFolder members as WebDataset samples.

Member ``<class>/.../<stem>.<ext>`` (an image, by ImageFolder's extensions) becomes the
sample ``<key>.<ext>`` + ``<key>.cls``, the label as ASCII digits as webdataset writes it,
label i being line i of the class list (``classes.txt``, written beside the shards). Like
ImageFolder, files directly in the root and files that are not images are left out.

Keys are the file stems with their dots made "_" (webdataset cuts a key at the first dot).
Two files with the same stem get ``<stem>_1``, ``<stem>_2``, ... in path order, so the names
depend on the input only, never on ``--workers``.
"""

from __future__ import annotations

import os

from shardfs.atomic import atomic_file
from shardfs.errors import UsageError
from shardfs.view.layouts import IMAGE_EXTS, split_key
from shardfs.pack.inputs import Member, check_name, join

CLASSES_FILE = "classes.txt"


def _key_and_ext(path: str) -> tuple[str, str]:
    stem, _, ext = os.path.basename(path).rpartition(".")
    return stem.replace(".", "_") or "sample", ext


def unique_keys(stems: list[str]) -> list[str]:
    """The stems, later repeats renamed ``<stem>_<n>`` (the smallest n not already a stem or key)."""
    taken = set(stems)
    seen: set[str] = set()
    keys = []
    for stem in stems:
        key = stem
        if stem in seen:
            n = 1
            while f"{stem}_{n}" in taken:
                n += 1
            key = f"{stem}_{n}"
            taken.add(key)
        seen.add(stem)
        keys.append(key)
    return keys


def to_samples(members: list[Member], classes: list[str] | None, spool: str,
               under: str = "") -> tuple[list[Member], list[str]]:
    """(the sample members, the class list). ``members`` are named ``<class>/...`` (no ``under``);
    ``classes`` fixes the labels (a mapping's class list), else they are the sorted class folders."""
    images = sorted((m for m in members if "/" in m.name and _key_and_ext(m.name)[1].lower().encode() in IMAGE_EXTS),
                    key=lambda m: m.key)
    if not images:
        raise UsageError("--layout webdataset: no image in a class folder (<class>/<file>.jpg, ...)")
    folders = [m.name.split("/", 1)[0] for m in images]
    if classes is None:
        classes = sorted(set(folders))  # ImageFolder's class order
    label_of = {name: i for i, name in enumerate(classes)}
    keys = unique_keys([_key_and_ext(m.name)[0] for m in images])
    out: list[Member] = []
    with open(spool, "wb") as labels:
        for m, folder, key in zip(images, folders, keys):
            text = str(label_of[folder]).encode()
            ext = _key_and_ext(m.name)[1]
            out.append(Member(check_name(join(under, f"{key}.{ext}")), m.size, m.source, m.offset, m.mode, m.mtime))
            out.append(Member(check_name(join(under, f"{key}.cls")), len(text), spool, labels.tell(), 0o644, m.mtime))
            labels.write(text)
    return out, classes


def sample_key(name: bytes) -> bytes:
    """The sample a member belongs to (its key, as the mount's imagefolder layout reads it)."""
    parts = split_key(name)
    return parts[0] if parts else name


def write_classes(out_dir: str, classes: list[str]) -> str:
    path = os.path.join(out_dir, CLASSES_FILE)
    with atomic_file(path) as out:
        out.write("".join(f"{c}\n" for c in classes).encode("utf-8", "surrogateescape"))
    return path
