"""libfuse 3.10, as the clusters run it (Rocky 9, Ubuntu 22.04, Debian 11): Debian 11's runtime
packages, fetched with `apt-get download` from the bullseye suite of the archive apt already uses
here, and unpacked with `dpkg -x` into a private prefix (never installed over the system's).

A mount uses it through SHARDFS_LIBFUSE=<prefix>/lib/<triplet>/libfuse3.so.3 or LD_LIBRARY_PATH.
The download is kept under ~/.cache, so a rerun costs an unpack.
"""

from __future__ import annotations

import glob
import os
import subprocess

SUITE = "bullseye"
PACKAGES = {"libfuse3-3": "3.10.3-2", "fuse3": "3.10.3-2"}
VERSION = "3.10.3"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class Unavailable(RuntimeError):
    """The archive cannot be reached or has not got the packages (why, in the message)."""


def archive_uri() -> str:
    """The Debian archive apt uses (its sources, deb822 or one-line), never a hard-coded host."""
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        with open(path) as f:
            for stanza in f.read().split("\n\n"):
                fields = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line and line[0] != "#")
                uris, suites = fields.get("URIs", "").split(), fields.get("Suites", "").split()
                if uris and suites and not any(s.endswith("-security") for s in suites):
                    return uris[0]
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        try:
            with open(path) as f:
                for words in (line.split() for line in f):
                    if len(words) >= 3 and words[0] == "deb" and not words[-2].endswith("-security"):
                        return next(w for w in words[1:] if "://" in w)
        except OSError:
            continue
    raise Unavailable("apt has no Debian archive configured (/etc/apt/sources.list.d/*.sources)")


def _apt(cache: str, *args: str, cwd: str | None = None) -> None:
    """apt-get on a private configuration: the bullseye suite only, lists and packages in ``cache``."""
    etc = os.path.join(cache, "etc")
    options = {"Dir::Etc::SourceList": "/dev/null", "Dir::Etc::SourceParts": etc,
               "Dir::Etc::Preferences": "/dev/null", "Dir::Etc::PreferencesParts": os.path.join(etc, "none"),
               "Dir::State::Lists": os.path.join(cache, "lists"), "Dir::Cache": os.path.join(cache, "apt"),
               "Acquire::Languages": "none", "APT::Sandbox::User": "root", "Acquire::http::Timeout": "20"}
    cmd = ["apt-get", "-q", *(f"-o{k}={v}" for k, v in options.items()), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"apt-get {args[0]} from {SUITE}: {exc}") from None
    if done.returncode != 0:
        raise Unavailable(f"apt-get {args[0]} from {SUITE} failed: {done.stderr.strip().splitlines()[-1:]}")


def debs(cache: str | None = None) -> list[str]:
    """The .deb files of PACKAGES, downloaded (and checked against the archive's signed lists) once."""
    cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "shardfs-tests", f"libfuse-{VERSION}")
    files = [os.path.join(cache, f"{name}_{version}_amd64.deb") for name, version in PACKAGES.items()]
    if all(os.path.exists(f) for f in files):
        return files
    for d in ("etc/none", "lists/partial", "apt/archives/partial"):
        os.makedirs(os.path.join(cache, d), exist_ok=True)
    with open(os.path.join(cache, "etc", f"{SUITE}.sources"), "w") as f:
        f.write(f"Types: deb\nURIs: {archive_uri()}\nSuites: {SUITE}\nComponents: main\nSigned-By: {KEYRING}\n")
    _apt(cache, "update")
    _apt(cache, "download", *(f"{name}={version}" for name, version in PACKAGES.items()), cwd=cache)
    return files


def unpack(prefix: str, cache: str | None = None) -> str:
    """libfuse 3.10 unpacked under ``prefix``; returns the path of its libfuse3.so.3."""
    for deb in debs(cache):
        subprocess.run(["dpkg", "-x", deb, prefix], check=True, timeout=60)
    found = glob.glob(os.path.join(prefix, "lib", "*", "libfuse3.so.3")) + glob.glob(
        os.path.join(prefix, "usr", "lib", "*", "libfuse3.so.3"))
    if not found:
        raise Unavailable(f"no libfuse3.so.3 in the packages unpacked under {prefix}")
    return found[0]
