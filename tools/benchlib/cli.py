"""The `shardfs` command as a subprocess, running this checkout's code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# `-m` puts the cwd (maybe another checkout) before PYTHONPATH; -P (3.11+) leaves it out, for this
# interpreter only (an environment variable would reach the commands `shardfs run` starts)
SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []


def copy_source(dest) -> None:
    """The checkout's source into ``dest``, as a build would see it: without version control, build
    products, the checkout's venv (gigabytes: tools/setup.sh's .venv) and test leftovers."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "__pycache__", "build", "dist", "site", ".pytest_cache", ".hypothesis",
        "fuzz-findings", "*.so"))


def shardfs(*args, check: bool = False, timeout: float = 7200, env: dict | None = None,
            preexec_fn=None) -> subprocess.CompletedProcess:
    """Run ``python -m shardfs ARGS``; with ``check``, a failure raises RuntimeError with its output.

    The checkout comes first on the child's PYTHONPATH, so a mount runs the code that is measured
    or tested even where an installed copy, or another checkout in the cwd, points elsewhere. Own session: a Ctrl-C on the terminal
    reaches us and not a `shardfs mount` half way through, so we can unmount in order."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, *SAFE_PATH, "-m", "shardfs", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, start_new_session=True, preexec_fn=preexec_fn)
    if check and done.returncode != 0:
        raise RuntimeError(f"shardfs {' '.join(map(str, args))} failed ({done.returncode}):\n"
                           f"{done.stdout}\n{done.stderr}")
    return done


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Any other command, its output captured as text."""
    return subprocess.run(cmd, capture_output=True, text=True, **kw)
