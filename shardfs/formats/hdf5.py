"""HDF5 files (``.h5``, ``.hdf5``) as the JSC course writes them: a group per split, each with a
variable-length uint8 ``images`` dataset and an integer ``targets`` dataset.

A variable-length element is stored as a heap ID (its length, the address of a global heap
collection, the object's index in it); the object's bytes lie in that collection uncompressed,
whatever the dataset's filters. So every image is a byte range of the file, served like a tar
member. h5py reads the groups, datasets and labels; the heap IDs (from contiguous storage, or
unfiltered chunks) and the collections' object headers are read here, since h5py does not say
where a variable-length element's bytes lie. No image byte is read but its first few (its type).
"""

from __future__ import annotations

import struct

import numpy as np

from shardfs.formats import datafile
from shardfs.formats.base import AsStored, ByteSource, ScanResult, ShardFormatError, Window
from shardfs.storage.base import ShardIOError

_HEAP_ID = np.dtype([("length", "<u4"), ("collection", "<u8"), ("index", "<u4")])  # 8-byte offsets
_COLLECTION = struct.Struct("<4sB3xQ")  # "GCOL", version, collection size
_OBJECT = struct.Struct("<HH4xQ")  # index, reference count, object size (data follows, padded to 8)
MAX_COLLECTION = 1 << 36


class _Heap:
    """Where global heap objects' bytes lie: each collection's object headers, walked once."""

    def __init__(self, win: Window, size: int):
        self.win, self.size = win, size
        self.objects: dict[int, dict[int, tuple[int, int]]] = {}  # collection -> index -> (offset, size)

    def find(self, collection: int, index: int) -> tuple[int, int]:
        objects = self.objects.get(collection)
        if objects is None:
            objects = self.objects[collection] = self._walk(collection)
        if index not in objects:
            raise ShardFormatError(f"global heap collection at {collection} has no object {index}")
        return objects[index]

    def _walk(self, at: int) -> dict[int, tuple[int, int]]:
        if at + _COLLECTION.size > self.size:
            raise ShardFormatError(f"global heap collection at {at} beyond the end (truncated?)")
        magic, version, length = _COLLECTION.unpack(self.win.get(at, _COLLECTION.size))
        if magic != b"GCOL" or version != 1 or not _COLLECTION.size <= length <= MAX_COLLECTION:
            raise ShardFormatError(f"no global heap collection at {at}")
        if at + length > self.size:
            raise ShardFormatError(f"global heap collection at {at} ends beyond the file (truncated)")
        objects, pos, end = {}, at + _COLLECTION.size, at + length
        while pos + _OBJECT.size <= end:
            index, _refs, size = _OBJECT.unpack(self.win.get(pos, _OBJECT.size))
            if index == 0:  # the free space: the last object
                break
            data = pos + _OBJECT.size
            if data + size > end:
                raise ShardFormatError(f"global heap object {index} at {pos} overruns its collection")
            objects[index] = (data, size)
            pos = data + size + (-size % 8)
        return objects


def _heap_ids(dset, win: Window) -> np.ndarray:
    """The dataset's raw heap IDs, from contiguous storage or unfiltered chunks."""
    n = dset.shape[0]
    offset = dset.id.get_offset()
    if offset is not None:
        return np.frombuffer(win.get(offset, n * _HEAP_ID.itemsize), _HEAP_ID, n)
    plist = dset.id.get_create_plist()
    if dset.chunks is None or plist.get_nfilters():
        raise ShardFormatError(f"{dset.name}: stored {'compact' if dset.chunks is None else 'with filters'}: "
                               "its images are not read here")
    ids = np.zeros(n, _HEAP_ID)
    rows = dset.chunks[0]
    for i in range(dset.id.get_num_chunks()):
        info = dset.id.get_chunk_info(i)
        first = info.chunk_offset[0]
        count = min(rows, n - first)
        ids[first : first + count] = np.frombuffer(win.get(info.byte_offset, count * _HEAP_ID.itemsize), _HEAP_ID)
    return ids


def _tables(h5py, f) -> list[tuple[str, object]]:
    """(split, group) for every group holding datasets: the root's own, and each child group's."""
    found = [("", f)]
    for name, item in f.items():
        if isinstance(item, h5py.Group):
            found.append((name, item))
    return found


def _columns(h5py, group) -> tuple[list[str], list[str], list[str]]:
    binary, integer, every = [], [], []
    for name, item in group.items():
        if not isinstance(item, h5py.Dataset):
            continue
        every.append(name)
        if item.ndim != 1:
            continue
        base = h5py.check_vlen_dtype(item.dtype)
        if base is not None and base == np.uint8:
            binary.append(name)
        elif np.issubdtype(item.dtype, np.integer):
            integer.append(name)
    return binary, integer, every


class Hdf5Format(AsStored):
    name = "hdf5"
    suffixes = (".h5", ".hdf5")

    def scan(self, src: ByteSource, columns: datafile.Columns = datafile.Columns()) -> ScanResult:
        path = getattr(src, "path", "")
        h5py = datafile.need("h5py", path)
        try:
            f = h5py.File(datafile.FileObject(src), "r")
        except ShardIOError:
            raise
        except (OSError, *datafile.MALFORMED) as exc:
            raise ShardFormatError(f"not a readable HDF5 file: {exc}") from None
        with f, datafile.checked("its groups"):  # h5py's errors for damaged metadata: RuntimeError, KeyError, ...
            return self._scan(h5py, f, Window(src), src, path, columns)

    def _scan(self, h5py, f, win: Window, src: ByteSource, path: str, columns) -> ScanResult:
        heap = _Heap(win, src.size)
        rows: list[datafile.Row] = []
        warnings: list[str] = []
        error, tables, total, every = None, 0, 0, []
        for split, group in _tables(h5py, f):
            binary, integer, names = _columns(h5py, group)
            every += [f"{split}/{n}" if split else n for n in names]
            if not binary:
                continue
            try:
                image, label = datafile.choose(path, columns, binary, integer, names)
            except datafile.NoColumns:
                continue  # judged over the whole file below
            tables += 1
            images, targets = group[image], group[label]
            if targets.shape[0] < images.shape[0]:
                warnings.append(f"{group.name}: {label} has {targets.shape[0]} labels for {images.shape[0]} images")
            try:
                ids = _heap_ids(images, win)
                labels = np.asarray(targets[()], np.int64)
                for k in range(min(len(ids), len(labels))):
                    length, collection, index = (int(v) for v in ids[k])
                    if collection == 0:
                        continue  # never written: no image
                    at, size = heap.find(collection, index)
                    if size != length:
                        raise ShardFormatError(f"{images.name}[{k}]: heap object of {size} bytes for {length}")
                    rows.append(datafile.Row(at, size, int(labels[k]), k, split,
                                             head=win.get(at, min(size, datafile.HEAD))))
                total = max(total, len(ids))
            except ShardIOError:
                raise
            except (ShardFormatError, OSError, *datafile.MALFORMED) as exc:  # OSError: h5py's for damaged data
                error = f"{group.name}: {exc}"
                break
        if not tables:
            datafile.choose(path, columns, [], [], every)  # raises NoColumns naming what it has
        mtime = getattr(src, "mtime_ns", 0) / 1e9
        return datafile.result(rows, total, mtime, None, warnings, error)


FORMAT = Hdf5Format()
