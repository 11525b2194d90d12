"""The documentation: the README and docs/ pages link only to files and headings that exist, the
package's long description (what PyPI shows) has no relative link, the job script in docs/ is the
README's, and the metrics table names every metric the daemon writes. The site itself is built
with `mkdocs build --strict` in .ci/run."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tarfile
from email.parser import Parser

import pytest

from benchlib.cli import REPO, copy_source

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
doclinks = pytest.importorskip("doclinks", reason="needs Python-Markdown (the test extra; docs/requirements.txt)")

README = os.path.join(REPO, "README.md")
PAGES = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
JOB_MARK = "<!-- slurm-job-script:"


def text_of(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def broken_links(page: str) -> tuple[list[str], list[str]]:
    """(every link of page, those that do not resolve): a relative link must name a file of the
    checkout, and its #anchor a heading of that page."""
    found = doclinks.read(text_of(page))
    broken = []
    for target in found.links:
        if not doclinks.is_relative(target):
            continue
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not where.startswith(REPO + os.sep) or not os.path.exists(where):
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in (doclinks.read(text_of(where)).ids if where.endswith(".md") else ()):
            broken.append(f"{target}: no such heading in {os.path.relpath(where, REPO)}")
    return found.links, broken


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: os.path.relpath(p, REPO))
def test_every_link_resolves(page):
    links, broken = broken_links(page)
    if page == README:  # the front page links to the pages: the renderer must find them
        assert len([t for t in links if t.startswith("docs/")]) >= 10, links
    assert broken == []


def test_the_readme_is_a_front_page():
    # the reference lives in docs/; the README stays something a newcomer reads in minutes
    lines = text_of(README).count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move reference material to a page under docs/"


def test_every_page_is_in_the_site():
    with open(os.path.join(REPO, "mkdocs.yml")) as f:
        nav = set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", f.read(), re.M))
    assert nav == {os.path.basename(p) for p in PAGES}


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S)


def test_the_job_script_in_docs_is_the_readmes():
    readme = text_of(README)
    # the block tests/test_slurm.py submits: the first after the mark
    [submitted, *_] = sh_blocks(readme[readme.index(JOB_MARK):])
    in_docs = [b for b in sh_blocks(text_of(os.path.join(REPO, "docs", "batch-jobs.md"))) if "#SBATCH" in b]
    assert in_docs == [submitted]


def test_every_metric_is_in_the_metrics_table():
    written = set(re.findall(r'"(shardfs_[a-z_]+)"', text_of(os.path.join(REPO, "shardfs", "service", "metrics.py"))))
    page = text_of(os.path.join(REPO, "docs", "node-service.md"))
    table = page[page.index("### Metrics"):]
    documented = {re.sub(r"_total$", "", n) for n in re.findall(r"`(shardfs_[a-z_]+)`", table)}
    assert len(written) > 40  # the names were found at all
    assert sorted(written - documented) == [], "metrics the daemon writes that docs/node-service.md does not name"
    assert sorted(documented - written) == [], "metrics docs/node-service.md names that the daemon does not write"


def repository_url() -> str:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")


def check_long_description(description: str) -> None:
    """What PyPI shows: the README with every link absolute, relative ones against the repository."""
    readme = doclinks.read(text_of(README)).links
    shown = doclinks.read(description).links
    assert len(shown) == len(readme) > 0
    assert [t for t in shown if doclinks.is_relative(t)] == []
    base = repository_url()
    for before, after in zip(readme, shown):
        if doclinks.is_relative(before):
            path, _, anchor = before.partition("#")
            assert after == (f"{base}/blob/HEAD/{path}" + (f"#{anchor}" if anchor else "") if path
                             else f"{base}#{anchor}"), (before, after)
        else:
            assert after == before


@pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import build"]).returncode != 0,
                    reason="needs the build package (the test extra)")
def test_the_sdist_long_description_has_no_relative_link(tmp_path):
    # built from a copy: the build writes egg-info into its tree
    src = tmp_path / "src"
    copy_source(src)
    done = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", tmp_path / "dist",
                           src], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [sdist] = (tmp_path / "dist").iterdir()
    with tarfile.open(sdist) as tar:
        [info] = [m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        metadata = Parser().parsestr(tar.extractfile(info).read().decode())
    assert metadata["Description-Content-Type"] == "text/markdown"
    check_long_description(metadata.get_payload())
