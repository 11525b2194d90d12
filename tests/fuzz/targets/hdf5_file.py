"""An HDF5 file's groups and global heap (formats/hdf5.py: h5py for the groups and heap ids, its own
reader for the heap collections), indexed from the file's bytes as a mount indexes it.

Beyond "no crash" (fuzzlib.check_data_file): damage is refused or recorded, never raised; each
image served is exactly its size and, for the files as h5py wrote them (the seeds), the very bytes
h5py gives for that index (not for damaged ones: h5py's element reads hung on one, in the HDF5 C
library, so the reference is not asked); the index build's own allocations stay within a bound of
the file's size. (The HDF5 C library under h5py parses the metadata for the scan too: a crash or
hang there is a finding about the mount.)
"""

from __future__ import annotations

import hashlib
import io

from fuzzlib import check_data_file, sample_images


_WRITTEN: set[str] = set()  # sha256 of the seeds


def _h5py_rows(path: str, keys: set) -> dict:
    import h5py

    with open(path, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() not in _WRITTEN:
            return {}

    with h5py.File(path, "r") as f:
        return {(split, k): bytes(f[split]["images"][k].tobytes()) for split, k in keys}


def one_input(data: bytes) -> None:
    check_data_file(data, "data.h5", _h5py_rows)


def seeds() -> list[bytes]:
    import h5py
    import numpy as np

    images = sample_images(6, size=100)
    out = []
    for splits in (("train",), ("train", "val")):
        buf = io.BytesIO()
        with h5py.File(buf, "w") as f:
            for split in splits:
                group = f.create_group(split)
                data = group.create_dataset("images", (len(images),), dtype=h5py.vlen_dtype(np.dtype(np.uint8)))
                targets = group.create_dataset("targets", (len(images),), dtype=np.dtype("int16"))
                for k, image in enumerate(images):
                    data[k] = np.frombuffer(image, np.uint8)
                    targets[k] = k % 3
        out.append(buf.getvalue())
        _WRITTEN.add(hashlib.sha256(out[-1]).hexdigest())
    return out
