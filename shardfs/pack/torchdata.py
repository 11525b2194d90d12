"""Members from a map-style dataset (torchvision ImageFolder, CIFAR10, FakeData, ...).

Sample ``i`` with target ``t`` becomes ``<class>/<i>.<ext>``: ``<class>`` is
``dataset.classes[t]`` when the dataset has a class list, else the target number
(zero-padded to the widest one); ``<i>`` is zero-padded to the widest index so names
sort in index order. What ``dataset[i]`` returns decides the bytes:

* already encoded (``bytes``, or a file path) is stored as it is;
* a PIL image (or a uint8 numpy array, or a tensor) is encoded, losslessly as PNG by
  default (``image_format="JPEG", quality=90`` for JPEG).

A DatasetFolder/ImageFolder is read from ``dataset.samples`` (its files are stored as
they are, transforms are not applied and nothing is decoded).

Encoded samples go to spool files in a scratch directory, in fixed chunks of indices so
that the bytes do not depend on the number of worker processes.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ProcessPoolExecutor

from shardfs.errors import UsageError
from shardfs.pack.inputs import Member, check_name, class_folders, file_mode, join
from shardfs.view.layouts import check_component

CHUNK = 256  # samples per spool file (fixed: output must not depend on --workers)

_MAGIC = [
    (b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF87a", "gif"), (b"GIF89a", "gif"),
    (b"BM", "bmp"), (b"II*\x00", "tif"), (b"MM\x00*", "tif"),
]


def sniff_ext(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for magic, ext in _MAGIC:
        if data.startswith(magic):
            return ext
    return "bin"


def encode_image(image, image_format: str = "PNG", quality: int = 90) -> bytes:
    from PIL import Image

    if not isinstance(image, Image.Image):
        if hasattr(image, "detach"):  # a torch tensor (C x H x W)
            from torchvision.transforms.functional import to_pil_image

            image = to_pil_image(image)
        else:
            image = Image.fromarray(image)
    out = io.BytesIO()
    if image_format.upper() in ("JPEG", "JPG"):
        if image.mode not in ("RGB", "L", "CMYK"):
            image = image.convert("RGB")
        image.save(out, format="JPEG", quality=quality)
    else:
        image.save(out, format=image_format)
    return out.getvalue()


def _ext_for(image_format: str) -> str:
    return {"JPEG": "jpg", "JPG": "jpg", "TIFF": "tif"}.get(image_format.upper(), image_format.lower())


def _target(t):
    try:
        return int(t)
    except (TypeError, ValueError):
        return str(t)


# ---- the per-chunk job (top level: runs in worker processes) ---------------------

_DATASET = None  # set in each worker by _init (inherited on fork, pickled once otherwise)


def _init(dataset) -> None:
    global _DATASET
    _DATASET = dataset


def _encode_chunk(job):
    """Encode samples [start, stop) into one spool file; (target, ext, source, offset, size, mode, mtime) each."""
    start, stop, spool, image_format, quality = job
    rows = []
    with open(spool, "wb") as out:
        for i in range(start, stop):
            sample, target = _DATASET[i][:2]
            if isinstance(sample, (str, os.PathLike)):
                path = os.fspath(sample)
                st = os.stat(path)
                ext = os.path.splitext(path)[1].lstrip(".") or "bin"
                rows.append((_target(target), ext, path, -1, st.st_size, file_mode(st.st_mode), int(st.st_mtime)))
                continue
            if isinstance(sample, (bytes, bytearray, memoryview)):
                data, ext = bytes(sample), sniff_ext(bytes(sample[:16]))
            else:
                data, ext = encode_image(sample, image_format, quality), _ext_for(image_format)
            rows.append((_target(target), ext, spool, out.tell(), len(data), 0o644, 0))
            out.write(data)
    return rows


class _Samples:
    """A DatasetFolder seen as (path, target) pairs: nothing decoded, no transform."""

    def __init__(self, samples):
        self.samples = samples

    def __getitem__(self, i):
        return self.samples[i]


def _is_folder_dataset(dataset) -> bool:
    try:
        from torchvision.datasets import DatasetFolder
    except ImportError:
        return False
    return isinstance(dataset, DatasetFolder)


def members_from_dataset(dataset, spool_dir: str, under: str = "", image_format: str = "PNG", quality: int = 90,
                         workers: int = 1, mtime: int | None = None) -> list[Member]:
    n = len(dataset)
    if n == 0:
        raise UsageError("the dataset is empty")
    source = _Samples(dataset.samples) if _is_folder_dataset(dataset) else dataset
    jobs = [(start, min(start + CHUNK, n), os.path.join(spool_dir, f"chunk-{start // CHUNK:06d}"), image_format,
             quality) for start in range(0, n, CHUNK)]
    if workers > 1 and len(jobs) > 1:
        import multiprocessing

        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx, initializer=_init,
                                 initargs=(source,)) as pool:
            chunks = list(pool.map(_encode_chunk, jobs))
    else:
        _init(source)
        try:
            chunks = [_encode_chunk(job) for job in jobs]
        finally:
            _init(None)
    rows = [row for chunk in chunks for row in chunk]
    classes = getattr(dataset, "classes", None)
    targets = [row[0] for row in rows]
    if classes is not None and all(isinstance(t, int) and 0 <= t < len(classes) for t in targets):
        folders = [check_component(str(classes[t]), "dataset: class") for t in targets]
    else:
        folders = class_folders(targets, None, "dataset: ")
    width = len(str(n - 1))
    return [Member(check_name(join(under, folder, f"{i:0{width}d}.{ext}")), size, src, off, mode,
                   stamp if mtime is None else mtime)
            for i, ((_t, ext, src, off, size, mode, stamp), folder) in enumerate(zip(rows, folders))]
