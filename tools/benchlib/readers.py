"""Reading as training code reads: the ImageFolder listing, and pools of reader processes.

``open_read`` is what torchvision's ``pil_loader`` (and ``numpy.load``, ``json.load``) do per file:
the built-in buffered ``open(path, 'rb')``, which also calls ``isatty()`` (a TCGETS ioctl that a
FUSE mount forwards to its daemon). ``os_read`` is the lean os-level read (``os.open`` +
``os.readv`` into a reused buffer), reported next to it, not instead of it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # torchvision's


def imagefolder_files(root: str, extensions: tuple[str, ...] = IMG_EXTENSIONS) -> list[str]:
    """The file list ImageFolder makes, the way it makes it (torchvision.datasets.folder.find_classes
    and make_dataset): scandir of the root for class folders, then a sorted walk of each class."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    paths = []
    for cls in classes:
        for top, _dirs, names in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            paths.extend(os.path.join(top, n) for n in sorted(names) if n.lower().endswith(extensions))
    return paths


def timed_listing(root: str) -> tuple[list[str], float]:
    t0 = time.perf_counter()
    paths = imagefolder_files(root)
    return paths, time.perf_counter() - t0


def open_read(path: str, _buf) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def os_read(path: str, buf) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 0
        while (k := os.readv(fd, [buf])) > 0:
            n += k
        return n
    finally:
        os.close(fd)


HOW = {"open": open_read, "os": os_read}


def _read_bytes() -> int:
    """What this process has read from storage (not the page cache): a plain directory's disk reads."""
    with open("/proc/self/io") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes:"))


def _reader(i: int, paths: list[str], how: str, barrier, results, budget_s: float | None, done) -> None:
    read = HOW[how]
    buf = memoryview(bytearray(1 << 20))
    files = nbytes = errors = 0
    first_error = None
    io0 = _read_bytes()
    barrier.wait()
    start = time.monotonic()
    deadline = start + budget_s if budget_s else None
    for p in paths:
        if deadline is not None and time.monotonic() >= deadline:
            break
        try:
            nbytes += read(p, buf)
            files += 1
            if done is not None:
                with done.get_lock():
                    done.value += 1
        except OSError as exc:
            errors += 1
            first_error = first_error or f"{p}: {exc}"
    results.put((time.monotonic(), files, nbytes, errors, first_error, _read_bytes() - io0, i, files + errors,
                 start))


def read_all(paths: list[str], readers: int, how: str = "open", seed: int | None = None,
             budget_s: float | None = None, done=None) -> dict:
    """Every file of ``paths`` read once (in a random order when ``seed`` is given), split among
    ``readers`` forked processes that start together; files/s and MB/s over the wall time.

    ``done``: a ``multiprocessing.Value`` counting the files read so far, for whoever watches
    the pass while it runs.

    ``budget_s``: each reader stops after that many seconds; then ``budget_hit`` is True and
    ``read`` lists the files that were read (the figures are over those)."""
    if seed is not None:
        paths = list(paths)
        random.Random(seed).shuffle(paths)
    ctx = mp.get_context("fork")  # the path list is inherited, not pickled (1M paths)
    barrier, results = ctx.Barrier(readers + 1), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(i, paths[i::readers], how, barrier, results, budget_s, done))
             for i in range(readers)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=600)
        got = [results.get() for _ in procs]
    except BaseException:  # a signal to us alone (SIGTERM): the readers go now, not at the end of the pass
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join()
    # From the readers' own clocks: with a few files they may finish before this process wakes up.
    secs = max(g[0] for g in got) - min(g[8] for g in got)
    files, nbytes, errors = (sum(g[i] for g in got) for i in (1, 2, 3))
    out = {"seconds": secs, "files": files, "bytes": nbytes, "errors": errors,
           "first_error": next((g[4] for g in got if g[4]), None),
           "files_per_s": files / secs, "mb_per_s": nbytes / secs / 1e6,
           "readers_read_bytes": sum(g[5] for g in got), "budget_hit": files + errors < len(paths)}
    if out["budget_hit"]:
        out["read"] = [p for g in got for p in paths[g[6]::readers][:g[7]]]
    return out
