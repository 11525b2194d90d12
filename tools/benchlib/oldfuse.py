"""Older libfuse releases, as the clusters run them, in private prefixes (never installed over the
system's):

- 3.10 (Rocky 9, Ubuntu 22.04, Debian 11): Debian 11's runtime packages, fetched with `apt-get
  download` from the bullseye suite of the archive apt already uses here, and unpacked with `dpkg -x`.
  The download is kept under ~/.cache, so a rerun costs an unpack.
- 3.3.0 (RHEL/Rocky/Alma 8) and 3.9.0 (Ubuntu 20.04): the builds in `shared/libfuse/` beside the
  repository (its README says how they were made), where that folder exists.

A mount uses one through SHARDFS_LIBFUSE=<its libfuse3.so.3> or LD_LIBRARY_PATH.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

SUITE = "bullseye"
PACKAGES = {"libfuse3-3": "3.10.3-2", "fuse3": "3.10.3-2"}
VERSION = "3.10.3"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# shared/libfuse/ beside the repository (in CI: a fresh clone with a copy of shared/ beside it)
SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                      "shared", "libfuse")


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


def shared_build(version: str, prefix: str) -> str:
    """libfuse ``version`` from SHARED in ``prefix`` as a package installs it: lib/libfuse3.so.3
    (a link to the library file) and bin/fusermount3 (setuid root, for users other than root; the
    library and fusermount3 of one release go together). Returns the path of the library file."""
    build = os.path.join(SHARED, version)
    found = glob.glob(os.path.join(build, f"libfuse3.so.{version}"))
    if not found or not os.path.exists(os.path.join(build, "fusermount3")):
        raise Unavailable(f"no build of libfuse {version} in {SHARED} (its library and fusermount3)")
    lib, bin_ = os.path.join(prefix, "lib"), os.path.join(prefix, "bin")
    os.makedirs(lib, exist_ok=True)
    os.makedirs(bin_, exist_ok=True)
    # copies: a copy of shared/ may hold the libfuse3.so.3 link as a file naming its target
    library = os.path.join(lib, os.path.basename(found[0]))
    if os.path.exists(library):  # made before (and perhaps mapped by a daemon now)
        return library
    shutil.copy(found[0], library)
    if not os.path.lexists(os.path.join(lib, "libfuse3.so.3")):
        os.symlink(os.path.basename(library), os.path.join(lib, "libfuse3.so.3"))
    fusermount = shutil.copy(os.path.join(build, "fusermount3"), bin_)
    if os.getuid() == 0:
        os.chown(fusermount, 0, 0)
        os.chmod(fusermount, 0o4755)
    return library
