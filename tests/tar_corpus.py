"""Tar archives written by real tools (GNU tar, bsdtar, Python's tarfile, WebDataset) from one
source tree, each with what `tar -x` extracts from it: the corpus of the differential and fuzz tests."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

LONG_100 = "long/" + "a" * 60 + "/" + "b" * 50 + ".bin"  # > 100 bytes: GNU 'L', PAX path or ustar prefix
LONG_255 = "long/" + "/".join(["c" * 100] * 3) + ".bin"  # > 255 bytes: beyond ustar's prefix+name
UNICODE = "unicode/naïve-日本.txt"
SPARSE = "sparse/holes.bin"


@dataclass
class Case:
    name: str
    archives: list[Path]  # one shard each (several for WebDataset shards and multi-volume sets)
    reference: Path  # what `tar -x` made of them


def make_tree(root: Path, seed: int = 0, big: int = 200_000) -> Path:
    """Every kind of member the writers know: long names and link targets, hard links, symlinks,
    an empty file and directory, a real sparse file (holes made by seeking), a fifo."""
    rng = random.Random(seed)
    blob = lambda n: rng.randbytes(n)  # noqa: E731
    files = {"plain/small.txt": b"hello\n", "plain/empty": b"", "plain/block.bin": blob(512),
             "plain/big.bin": blob(big), LONG_100: blob(700), LONG_255: blob(1500), UNICODE: "ünï\n".encode(),
             "sparse/after.txt": b"after the sparse file\n"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    with open(root / SPARSE, "wb") as f:  # nine data runs: more than the four an old GNU header holds
        for i in range(9):
            f.seek(i * 200_000)
            f.write(blob(3000))
        f.truncate(2_000_000)
    os.link(root / "plain/small.txt", root / "plain/hard")
    (root / "links").mkdir()
    os.symlink("../plain/small.txt", root / "links/short")
    os.symlink("../" + LONG_255, root / "links/long_target")  # > 100 bytes: GNU 'K' or PAX linkpath
    (root / "emptydir").mkdir()
    (root / "special").mkdir()
    os.mkfifo(root / "special/fifo")
    return root


def _run(cmd: list[str], ok=(0,)) -> None:
    done = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode in ok, f"{cmd}: {done.returncode}\n{done.stderr.decode()}"


def extract(archives: list[Path], reference: Path, multivolume: bool = False) -> Path:
    """The reference: GNU tar's own extraction (one -M run for a multi-volume set)."""
    reference.mkdir(parents=True)
    # Exit 2 with names ustar/v7 could not hold or a cut last volume: what was written still counts.
    if multivolume:
        _run(["tar", "-x", "-M", *[a for p in archives for a in ("-f", str(p))], "-C", str(reference)])
    for path in archives if not multivolume else []:
        _run(["tar", "-x", "-f", str(path), "-C", str(reference)], ok=(0, 2))
    return reference


def _gnu_tar(fmt: str, *extra: str) -> Callable[[Path, Path], list[Path]]:
    def write(src: Path, out: Path) -> list[Path]:
        path = out / "a.tar"
        # ustar and v7 cannot hold every name: tar writes the rest and exits 2.
        _run(["tar", "-c", "--sort=name", f"--format={fmt}", *extra, "-f", str(path), "-C", str(src), "."],
             ok=(0, 2) if fmt in ("ustar", "v7") else (0,))
        return [path]
    return write


def _bsdtar(fmt: str) -> Callable[[Path, Path], list[Path]]:
    def write(src: Path, out: Path) -> list[Path]:
        path = out / "a.tar"
        _run(["bsdtar", "-c", "--format", fmt, "-f", str(path), "-C", str(src), "."], ok=(0, 1))
        return [path]
    return write


def _tarfile(fmt: int) -> Callable[[Path, Path], list[Path]]:
    def write(src: Path, out: Path) -> list[Path]:
        path = out / "a.tar"
        with tarfile.open(path, "w", format=fmt) as tf:
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames.sort()
                for name in sorted(dirnames + filenames):
                    full = os.path.join(dirpath, name)
                    try:
                        tf.add(full, os.path.relpath(full, src), recursive=False)
                    except ValueError:  # a name USTAR_FORMAT cannot hold
                        assert fmt == tarfile.USTAR_FORMAT
        return [path]
    return write


def _samples(count: int) -> list[dict]:
    rng = random.Random(7)
    return [{"__key__": f"sample{i:04d}" + ("_" + "k" * 120 if i % 3 == 0 else ""), "jpg": rng.randbytes(rng.randrange(2000)),
             "cls": i % 10, "json": {"i": i, "name": "é"}} for i in range(count)]


def _wds_tarwriter(src: Path, out: Path) -> list[Path]:
    import webdataset

    path = out / "a.tar"
    with open(path, "wb") as f, webdataset.TarWriter(f) as sink:
        for sample in _samples(20):
            sink.write(sample)
    return [path]


def _wds_shardwriter(src: Path, out: Path) -> list[Path]:
    import webdataset

    with webdataset.ShardWriter(str(out / "wds-%04d.tar"), maxcount=7, verbose=0) as sink:
        for sample in _samples(20):
            sink.write(sample)
    return sorted(out.glob("wds-*.tar"))


def _incremental(level: int) -> Callable[[Path, Path], list[Path]]:
    """GNU tar --listed-incremental: level 0, or level 1 after changes (dumpdir 'D' members)."""
    def write(src: Path, out: Path) -> list[Path]:
        tree = out / "tree"
        _run(["cp", "-a", str(src), str(tree)])  # keeps the holes, hard links and the fifo
        snar = out / "snar"
        paths = [out / "level0.tar"]
        _run(["tar", "-c", "--format=gnu", f"--listed-incremental={snar}", "-f", str(paths[0]), "-C", str(tree), "."])
        if level:
            (tree / "plain/small.txt").write_bytes(b"changed after level 0\n")
            (tree / "plain/new.txt").write_bytes(b"new in level 1\n")
            (tree / "plain/big.bin").unlink()
            (tree / "newdir").mkdir()
            (tree / "newdir/inside").write_bytes(b"x" * 1000)
            paths = [out / "level1.tar"]
            _run(["tar", "-c", "--format=gnu", f"--listed-incremental={snar}", "-f", str(paths[0]), "-C", str(tree), "."])
        return paths
    return write


def _multivolume(fmt: str) -> Callable[[Path, Path], list[Path]]:
    """GNU tar -M: files cut across 64 KiB volumes ('M' members, or GNU.volume records for posix)."""
    def write(src: Path, out: Path) -> list[Path]:
        paths = [out / f"v{i}.tar" for i in range(1, 9)]
        _run(["tar", "-c", "-M", "-L", "64", "--sort=name", f"--format={fmt}",
              *[a for p in paths for a in ("-f", str(p))], "-C", str(src), "plain", "long"])
        return [p for p in paths if p.exists()]
    return write


def _volume_label(src: Path, out: Path) -> list[Path]:
    path = out / "a.tar"
    _run(["tar", "-c", "-V", "my label", "--format=gnu", "-f", str(path), "-C", str(src), "plain"])
    return [path]


WRITERS: dict[str, Callable[[Path, Path], list[Path]]] = {
    **{f"gnutar-{fmt}": _gnu_tar(fmt, "--sparse") for fmt in ("gnu", "oldgnu", "posix")},
    **{f"gnutar-{fmt}": _gnu_tar(fmt) for fmt in ("ustar", "v7")},  # tar refuses --sparse with these
    **{f"gnutar-posix-sparse-{v}": _gnu_tar("posix", "--sparse", f"--sparse-version={v}") for v in ("0.0", "0.1", "1.0")},
    "gnutar-gnu-no-sparse-option": _gnu_tar("gnu"),
    "gnutar-incremental-level0": _incremental(0),
    "gnutar-incremental-level1": _incremental(1),
    "gnutar-multivolume-gnu": _multivolume("gnu"),
    "gnutar-multivolume-posix": _multivolume("posix"),
    "gnutar-volume-label": _volume_label,
    **{f"bsdtar-{fmt}": _bsdtar(fmt) for fmt in ("pax", "paxr", "gnutar", "ustar", "v7")},
    "tarfile-ustar": _tarfile(tarfile.USTAR_FORMAT),
    "tarfile-gnu": _tarfile(tarfile.GNU_FORMAT),
    "tarfile-pax": _tarfile(tarfile.PAX_FORMAT),
    "webdataset-tarwriter": _wds_tarwriter,
    "webdataset-shardwriter": _wds_shardwriter,
}


def missing_tool(name: str) -> str | None:
    tool = "bsdtar" if name.startswith("bsdtar") else "tar"
    return None if shutil.which(tool) else f"needs {tool} (apt package {'libarchive-tools' if tool == 'bsdtar' else 'tar'})"


def build(name: str, src: Path, out: Path) -> Case:
    out.mkdir(parents=True, exist_ok=True)
    archives = WRITERS[name](src, out)
    return Case(name, archives, extract(archives, out / "reference", multivolume="multivolume" in name))
