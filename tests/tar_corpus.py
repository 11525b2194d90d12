"""Tar archives written by real tools (GNU tar, bsdtar, Python's tarfile, WebDataset) from one
source tree, each with what `tar -x` extracts from it: the corpus of the differential and fuzz tests."""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from shardfs.formats import sparse
from shardfs.formats.base import Kind
from shardfs.index import shard_index as index

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
    for path in archives if not multivolume else []:  # exit 2 also for a cut or damaged archive
        _run(["tar", "-x", "-f", str(path), "-C", str(reference)], ok=(0, 2))
    return reference


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def reference_entries(root: Path, attrs: bool = False) -> dict[bytes, tuple]:
    """Relative name -> ("file", sha256) / ("symlink", target) / ("dir", None) / ("other", None);
    ``attrs``: each also with its permission bits (None for a symlink) and whole-second mtime."""
    found = {}
    base = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, base)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", None)
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    found[rel] = ("file", sha256(f.read()))
            else:
                found[rel] = ("other", None)
            if attrs:
                found[rel] += (None if stat.S_ISLNK(st.st_mode) else stat.S_IMODE(st.st_mode), int(st.st_mtime))
    return found


def served_entries(case: Case) -> tuple[dict[bytes, tuple[str, object]], str]:
    """What shardfs serves from the case's shards, and every warning and error it gave, in one text.
    As in the mounted tree (view/tree.py), a path that is a directory anywhere is served as one."""
    served, notes, dirs = {}, [], set()
    for path in case.archives:
        ix = index.build(str(path))
        notes += ix.warnings + ([ix.error] if ix.error else [])
        data = path.read_bytes()
        for i in range(len(ix)):
            name, kind = ix.name(i), ix.kind[i]
            if kind == Kind.FILE:
                served[name] = ("file", sha256(member_bytes(ix, i, data, path.name)))
            elif kind == Kind.SYMLINK:
                served[name] = ("symlink", ix.symlinks[i])
            else:
                dirs.add(name)
        dirs.update(ix.dirs)  # parents of members are directories of the tree too
    for directory in list(dirs):
        while directory:
            served[directory] = ("dir", None)
            directory = directory.rpartition(b"/")[0]
    return served, "\n".join(notes)


def member_bytes(ix, i: int, data: bytes, shown: str) -> bytes:
    """Member i's bytes as shardfs serves them: a byte range of the shard, or a sparse file's runs."""
    start, size = int(ix.offset[i]), int(ix.size[i])
    runs = ix.sparse.get(i)
    stored = size if runs is None else int(runs[:, 1].sum())
    assert 0 <= start and start + stored <= len(data), f"{shown}: {ix.name(i)!r} outside the shard"
    if runs is None:
        return data[start : start + size]
    return sparse.read(runs, 0, size, lambda o, n: data[start + o : start + o + n])


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


# ---- the edge-case suite: what archive-mount projects test with ---------------------------------
# Each writer below makes archives of one kind of edge case; `edge_cases` adds copies of a few of
# them cut short or with a damaged header. The differential harness (test_tar_edge_cases.py)
# compares what shardfs serves from each with what `tar -x` extracts.

def make_edge_tree(root: Path, seed: int = 1) -> Path:
    """make_tree plus more sparse shapes (all holes, data only at the end, forty runs: more than
    one GNU extension block) and a folder of small files, so that a cut lands among many members."""
    make_tree(root, seed)
    rng = random.Random(seed)
    with open(root / "sparse/allholes.bin", "wb") as f:
        f.truncate(1_000_000)
    with open(root / "sparse/tail.bin", "wb") as f:
        f.seek(700_000)
        f.write(rng.randbytes(5000))
    with open(root / "sparse/forty.bin", "wb") as f:
        for i in range(40):
            f.seek(i * 65536 + 4096)
            f.write(rng.randbytes(1000 + i))
        f.truncate(41 * 65536)
    (root / "many").mkdir()
    for i in range(30):
        (root / f"many/f{i:02d}.txt").write_bytes(rng.randbytes(rng.randrange(3000)))
    return root


def _tarfile_members(members: list[tuple[str, str, object]]) -> Callable[[Path, Path], list[Path]]:
    """An archive of the given members in order: (name, "file" | "dir" | "symlink" | "hardlink", data or target)."""
    def write(src: Path, out: Path) -> list[Path]:
        path = out / "a.tar"
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
            for name, kind, value in members:
                info = tarfile.TarInfo(name)
                info.mtime, info.mode = 1_600_000_000, 0o755 if kind == "dir" else 0o644
                if kind == "file":
                    info.size = len(value)
                    tf.addfile(info, io.BytesIO(value))
                    continue
                info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
                info.linkname = value or ""
                tf.addfile(info)
        return [path]
    return write


def _absolute_gnu_tar(tool: str) -> Callable[[Path, Path], list[Path]]:
    """Members named by absolute paths (`-P` keeps the leading slash)."""
    def write(src: Path, out: Path) -> list[Path]:
        path = out / "a.tar"
        _run([tool, "-c", "-P", "-f", str(path), str(src / "many"), str(src / "links"), str(src / "plain")])
        return [path]
    return write


def _appended(tool: str) -> Callable[[Path, Path], list[Path]]:
    """`tar -r`: a file archived again after a change; tar -x leaves the last one."""
    def write(src: Path, out: Path) -> list[Path]:
        tree, path = out / "tree", out / "a.tar"
        _run(["cp", "-a", str(src / "plain"), str(tree)])
        _run([tool, "-c", "-f", str(path), "-C", str(tree), "."])
        (tree / "small.txt").write_bytes(b"second version\n")
        (tree / "block.bin").write_bytes(b"third" * 300)
        _run([tool, "-r", "-f", str(path), "-C", str(tree), "small.txt", "block.bin"])
        (tree / "small.txt").write_bytes(b"third version, longer than the others\n")
        _run([tool, "-r", "-f", str(path), "-C", str(tree), "small.txt"])
        return [path]
    return write


_BLOB = bytes(range(256)) * 9
EDGE_WRITERS: dict[str, Callable[[Path, Path], list[Path]]] = {
    **{f"sparse-gnutar-{fmt}": _gnu_tar(fmt, "--sparse") for fmt in ("gnu", "oldgnu")},
    **{f"sparse-gnutar-posix-{v}": _gnu_tar("posix", "--sparse", f"--sparse-version={v}")
       for v in ("0.0", "0.1", "1.0")},
    "sparse-bsdtar-pax": _bsdtar("pax"),
    "absolute-gnutar": _absolute_gnu_tar("tar"),
    "absolute-bsdtar": _absolute_gnu_tar("bsdtar"),
    "names-tarfile": _tarfile_members([
        ("/abs/x.txt", "file", b"absolute"), ("//two/slashes.txt", "file", b"two"),
        ("./a//b/./c.txt", "file", b"denormal"),
        ("../up.txt", "file", b"climbs"), ("a/../down.txt", "file", b"dotdot"), ("/", "dir", None),
        ("./", "dir", None), ("a/b/", "dir", None), ("ok.txt", "file", _BLOB)]),
    "links-tarfile": _tarfile_members([
        ("target.txt", "file", b"the target\n"), ("s1", "symlink", "target.txt"), ("s2", "symlink", "s1"),
        ("s3", "symlink", "s2"), ("dir/up", "symlink", "../s3"), ("h1", "hardlink", "target.txt"),
        ("h2", "hardlink", "h1"), ("h3", "hardlink", "h2"), ("dangling", "symlink", "nowhere"),
        ("target.txt", "file", b"replaced after the links\n"), ("h4", "hardlink", "target.txt")]),
    "replaced-tarfile": _tarfile_members([
        ("f2d", "file", b"a file first"), ("f2d", "dir", None), ("f2d/in.txt", "file", b"inside"),
        ("e2f", "dir", None), ("e2f", "file", b"an empty folder, then a file"),
        ("d2f", "dir", None), ("d2f/kept.txt", "file", b"kept"), ("d2f", "file", b"tar cannot replace a full folder"),
        ("s2f", "symlink", "f2d"), ("s2f", "file", b"a link, then a file"),
        ("f2s", "file", b"a file, then a link"), ("f2s", "symlink", "e2f"),
        ("twice.txt", "file", b"first"), ("twice.txt", "file", b"second and last"),
        ("fthen", "file", b"a file"), ("fthen/child.txt", "file", b"under a file: tar cannot"),
        ("childthen/y.txt", "file", b"y"), ("childthen", "file", b"over a full folder: tar cannot"),
        ("dangling", "symlink", "nowhere"), ("dangling/child.txt", "file", b"under a dangling link: tar cannot"),
        ("ldir", "dir", None), ("lnk", "symlink", "ldir"), ("sub/lnk2", "symlink", "../lnk"),
        ("lnk/through.txt", "file", b"written through a link"), ("sub/lnk2/chain.txt", "file", b"through two links"),
        ("lnk/deeper/in.txt", "file", b"a folder made through a link")]),
    "appended-gnutar": _appended("tar"),
    "appended-bsdtar": _appended("bsdtar"),
    "incremental-level0": _incremental(0),
    "incremental-level1": _incremental(1),
}


def headers(data: bytes) -> list[int]:
    """Offsets of the headers (extended ones too), read with tarfile's number decoder."""
    offsets, pos = [], 0
    while pos + 512 <= len(data) and data[pos : pos + 512].count(0) < 512:
        offsets.append(pos)
        pos += 512 + (tarfile.nti(data[pos + 124 : pos + 136]) + 511) // 512 * 512
    return offsets


def _cuts(data: bytes) -> dict[str, bytes]:
    """Copies of an archive cut short (mid-data, mid-header, at a member's start, in its last
    block, without the end marker) or with one header damaged in the middle."""
    heads = headers(data)
    mid = heads[len(heads) // 2]
    damaged = bytearray(data)
    damaged[mid + 5] ^= 0x55  # a byte of its name: the checksum no longer matches
    return {"cut-mid-data": data[: heads[len(heads) // 3] + 512 + 700], "cut-mid-header": data[: mid + 100],
            "cut-at-member": data[:mid], "cut-last-block": data[: heads[-1] + 512 + 10],
            "cut-no-end-marker": data[: len(data.rstrip(b"\0")) + 1], "cut-half": data[: len(data.rstrip(b"\0")) // 2],
            "damaged-header": bytes(damaged)}


CUT_FROM = ["sparse-gnutar-posix-1.0", "sparse-gnutar-gnu", "appended-gnutar", "names-tarfile"]


def edge_cases(out: Path) -> list[Case]:
    """Every edge-case archive (EDGE_WRITERS, and cut or damaged copies of CUT_FROM's), each
    with GNU tar's extraction. Writers whose tool is missing are left out."""
    src = make_edge_tree(out / "src")
    cases = []
    for name, write in EDGE_WRITERS.items():
        if missing_tool(name.split("-", 1)[1]) is not None:
            continue
        where = out / name
        where.mkdir()
        archives = write(src, where)
        cases.append(Case(name, archives, extract(archives, where / "reference")))
        if name in CUT_FROM:
            for how, data in _cuts(archives[0].read_bytes()).items():
                cut = out / f"{name}-{how}"
                cut.mkdir()
                (cut / "a.tar").write_bytes(data)
                cases.append(Case(cut.name, [cut / "a.tar"], extract([cut / "a.tar"], cut / "reference")))
    return cases
