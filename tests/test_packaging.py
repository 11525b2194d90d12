"""Packaging as users install it: `python -m build` makes an sdist and a wheel, each installs into a
fresh virtual environment and mounts, serves ImageFolder and unmounts from there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from benchlib.cli import REPO
from conftest import needs_fuse
from shardfs import __version__

pytestmark = [needs_fuse, pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import build"]).returncode != 0,
                                             reason="needs the build package (pip install build)")]

SMOKE = r'''
import os, sys
import shardfs
from torchvision import datasets
assert shardfs.__file__.startswith(sys.prefix), shardfs.__file__  # the installed copy, not a checkout
with shardfs.mounted(sys.argv[1]) as root:
    train = datasets.ImageFolder(os.path.join(root, "train"))
    image, label = train[len(train) - 1]
    print(len(train), len(train.classes), image.size, label, os.path.ismount(root))
print(os.path.exists(root))
'''


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """sdist and wheel built from a copy of the source (the build writes egg-info into its tree)."""
    top = tmp_path_factory.mktemp("build")
    src = top / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "*.egg-info", "__pycache__", "build", "dist",
                                                              ".pytest_cache", "*.so"))
    # --no-isolation: build with the setuptools installed here (no download); the result is the same
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(top / "dist"), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {p.name.split("-")[-1].split(".")[-1]: p for p in (top / "dist").iterdir()}


@pytest.mark.parametrize("kind", ["whl", "gz"])
def test_built_package_installs_into_a_fresh_venv_and_mounts(kind, dists, tar_shards, tmp_path):
    assert sorted(dists) == ["gz", "whl"]
    # A platform wheel: it carries the compiled request loop, built against libfuse3 here.
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert dists["whl"].name.startswith(f"shardfs-{__version__}-{tag}-{tag}-linux_")
    venv = tmp_path / "venv"
    # torch and the dependencies come from this interpreter's site-packages (no download);
    # shardfs itself from the distribution.
    # Without a pip (and the old setuptools it brings) of its own: our pip installs into it, and
    # the sdist builds with the setuptools installed here.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
                           "--no-index", "--no-build-isolation", "--disable-pip-version-check", str(dists[kind])],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    version = subprocess.run([venv / "bin" / "shardfs", "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert version.stdout.strip() == f"shardfs {__version__}"
    smoke = subprocess.run([venv / "bin" / "python", "-c", SMOKE, str(tar_shards)], capture_output=True, text=True,
                           env={**env, "PATH": f"{venv / 'bin'}:{env['PATH']}"}, timeout=300, cwd=tmp_path)
    assert smoke.returncode == 0, smoke.stderr
    assert smoke.stdout.split("\n")[:2] == ["72 6 (64, 64) 5 True", "False"]
