"""Packaging as users install it: `python -m build` makes an sdist and a wheel where libfuse's headers
cannot be found (as on a cluster node), auditwheel says which manylinux tag the wheel meets and
tags it, and each installs into a fresh virtual environment and mounts, serves ImageFolder and
every file's bytes, and unmounts from there."""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
import zipfile

from pathlib import Path

import pytest

from benchlib import sample
from benchlib.cli import copy_source
from conftest import needs_fuse
from shardfs import __version__

pytestmark = [
    needs_fuse,
    pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import build, auditwheel"]).returncode != 0,
                       reason="needs the build and auditwheel packages (the test extra)"),
    pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"),
                       reason="needs root and unshare to hide libfuse's headers"),
]

SMOKE = r'''
import hashlib, json, os, sys
import shardfs
from torchvision import datasets
assert shardfs.__file__.startswith(sys.prefix), shardfs.__file__  # the installed copy, not a checkout
with shardfs.mounted(sys.argv[1]) as root:
    train = datasets.ImageFolder(os.path.join(root, "train"))
    image, label = train[len(train) - 1]
    digests = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                digests[os.path.relpath(f.name, root)] = hashlib.sha256(f.read()).hexdigest()
    print(len(train), len(train.classes), image.size, label, os.path.ismount(root))
print(os.path.exists(root))
print(json.dumps(digests))
'''


def without_libfuse_headers(cmd: list, env: dict, **kw) -> subprocess.CompletedProcess:
    """cmd where a build cannot find libfuse's headers: pkg-config knows no fuse3 (an empty
    PKG_CONFIG_LIBDIR), and /usr/include/fuse3, where libfuse3-dev puts them, is an empty tmpfs in
    a private mount namespace. Fails before cmd runs if either is still found."""
    empty = os.path.join(kw["cwd"], "no-pkgconfig")
    os.makedirs(empty, exist_ok=True)
    hide = ["mount -t tmpfs -o ro tmpfs /usr/include/fuse3"] if os.path.isdir("/usr/include/fuse3") else []
    script = " && ".join([*hide, "! pkg-config --exists fuse3 2>/dev/null",
                          "[ ! -e /usr/include/fuse3/fuse_lowlevel.h ]", 'exec "$@"'])
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script, "sh", *map(str, cmd)],
                          env={**env, "PKG_CONFIG_LIBDIR": empty, "PKG_CONFIG_PATH": ""}, capture_output=True,
                          text=True, **kw)


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """sdist and wheel built from a copy of the source (the build writes egg-info into its tree),
    the wheel as auditwheel tagged it; and what auditwheel said of it."""
    top = tmp_path_factory.mktemp("build")
    src = top / "src"
    copy_source(src)
    # --no-isolation: build with the setuptools installed here (no download); the result is the same
    done = without_libfuse_headers([sys.executable, "-m", "build", "--no-isolation", "--outdir", top / "dist", src],
                                   dict(os.environ), cwd=top, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    built = {p.name.split("-")[-1].split(".")[-1]: p for p in (top / "dist").iterdir()}
    assert sorted(built) == ["gz", "whl"]
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", built["whl"]], capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    tag = re.search(r'consistent with the\s+following platform tag:\s+"([^"]+)"', show.stdout)
    assert tag, show.stdout
    repair = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--plat", tag[1], "-w", top / "tagged",
                             built["whl"]], capture_output=True, text=True, timeout=120)
    assert repair.returncode == 0, repair.stderr
    [tagged] = (top / "tagged").iterdir()
    return {"gz": built["gz"], "whl": tagged, "built": built["whl"], "tag": tag[1], "show": show.stdout}


def test_the_wheel_is_manylinux_and_carries_no_libfuse(dists):
    # one wheel for CPython 3.10 and newer: the limited API of 3.10 (setup.py)
    assert dists["built"].name.startswith(f"shardfs-{__version__}-cp310-abi3-linux_")
    # glibc 2.17 (manylinux2014) on x86_64, where the loop binds dlopen to its first symbol
    # version; elsewhere at most Rocky/RHEL 9's 2.34
    glibc = tuple(map(int, re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", dists["tag"]).groups()))
    assert glibc == (2, 17) if platform.machine() == "x86_64" else glibc <= (2, 34)
    assert dists["whl"].name.endswith(f"{dists['tag']}.whl") and dists["tag"] in dists["whl"].name
    from elftools.elf.elffile import ELFFile

    with zipfile.ZipFile(dists["whl"]) as whl:
        assert not [n for n in whl.namelist() if ".libs/" in n]  # auditwheel grafted nothing
        # the request loop, the tar scanner, the zip directory's loops
        modules = sorted(n for n in whl.namelist() if n.endswith(".so"))
        # every compiled module keeps the wheel's one tag (setup.py's ABI3)
        assert modules == ["shardfs/formats/_tarscan.abi3.so", "shardfs/formats/_zipdir.abi3.so",
                           "shardfs/fuse/_lowlevel.abi3.so"], modules
        whl.extractall(dists["whl"].parent / "x", modules)
    for module in modules:
        with open(dists["whl"].parent / "x" / module, "rb") as f:
            needed = [t.needed for t in ELFFile(f).get_section_by_name(".dynamic").iter_tags()
                      if t.entry.d_tag == "DT_NEEDED"]
        # libfuse3 and zlib are the node's, opened when shardfs starts
        assert not [n for n in needed if "fuse" in n or "libz" in n], (module, needed)


def test_the_wheels_long_description_has_no_relative_link(dists):
    # what PyPI shows; the sdist's is checked in test_docs.py, which builds one without this module's root
    from email.parser import Parser

    from test_docs import check_long_description

    with zipfile.ZipFile(dists["whl"]) as whl:
        [name] = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(whl.read(name).decode())
    check_long_description(metadata.get_payload())


@pytest.mark.parametrize("kind", ["whl", "gz"])
def test_built_package_installs_into_a_fresh_venv_and_mounts(kind, dists, sample_tree, tar_shards, tmp_path):
    venv = tmp_path / "venv"
    # torch and the dependencies come from this interpreter's site-packages (no download);
    # shardfs itself from the distribution.
    # Without a pip (and the old setuptools it brings) of its own: our pip installs into it, and
    # the sdist builds with the setuptools installed here.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    # The suite runs in a venv itself (tools/setup.sh): its packages, not only the base interpreter's,
    # are the new venv's "system" ones (a .pth line names each of its site folders).
    inner = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    Path(inner, "suite-venv.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-index",
               "--no-build-isolation", "--disable-pip-version-check", dists[kind]]
    if kind == "whl":  # no compiler in reach
        done = subprocess.run(install, capture_output=True, text=True, env={**env, "PATH": str(venv / "bin"),
                              "CC": "/nonexistent/cc"}, timeout=300, cwd=tmp_path)
    else:  # compiles the loop with nothing of libfuse's at hand
        done = without_libfuse_headers(install, env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    version = subprocess.run([venv / "bin" / "shardfs", "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert version.stdout.strip() == f"shardfs {__version__}"
    smoke = subprocess.run([venv / "bin" / "python", "-c", SMOKE, str(tar_shards)], capture_output=True, text=True,
                           env={**env, "PATH": f"{venv / 'bin'}:{env['PATH']}"}, timeout=300, cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stderr
    lines = smoke.stdout.split("\n")
    assert lines[:2] == ["72 6 (64, 64) 5 True", "False"]
    assert json.loads(lines[2]) == sample.digests(str(sample_tree))


# Every file's sha256 through a mount, from a Python without torchvision.
SERVED = r'''
import hashlib, json, os, sys
import shardfs
import shardfs.fuse._lowlevel as loop
assert shardfs.__file__.startswith(sys.prefix), shardfs.__file__
with shardfs.mounted(sys.argv[1]) as root:
    digests = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                digests[os.path.relpath(f.name, root)] = hashlib.sha256(f.read()).hexdigest()
print(json.dumps({"python": list(sys.version_info[:2]), "loop": os.path.basename(loop.__file__), "digests": digests}))
'''


def _interpreter(minor: int) -> str | None:
    """A CPython 3.<minor> on this machine: one of pyenv's, or on PATH (not pyenv's shim of it)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    versions = sorted(glob.glob(os.path.join(root, "versions", f"3.{minor}.*", "bin", f"python3.{minor}")))
    found = shutil.which(f"python3.{minor}")
    return versions[-1] if versions else found if found and "/shims/" not in found else None


@pytest.mark.slow
@pytest.mark.parametrize("minor", [10, 11, 12, 13, 14])
def test_the_one_wheel_installs_and_mounts_on_each_python(minor, dists, sample_tree, tar_shards, tmp_path):
    """The abi3 wheel in a fresh virtual environment of each CPython found here; its dependencies
    come from the package index pip is configured with."""
    python = _interpreter(minor)
    if python is None:
        pytest.skip(f"no CPython 3.{minor} on this machine (PATH or pyenv)")
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           dists["whl"]], capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    if done.returncode != 0 and "No matching distribution" in done.stderr + done.stdout:
        pytest.skip(f"the dependencies cannot be installed from the package index: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stdout + done.stderr
    served = subprocess.run([venv / "bin" / "python", "-c", SERVED, str(tar_shards)], capture_output=True, text=True,
                            env={**env, "PATH": f"{venv / 'bin'}:{env['PATH']}"}, timeout=300, cwd=tmp_path)
    assert served.returncode == 0, served.stderr
    out = json.loads(served.stdout)
    assert out["python"] == [3, minor] and out["loop"] == "_lowlevel.abi3.so"
    assert out["digests"] == sample.digests(str(sample_tree))
