"""The compiled parts, built by pip install with a C compiler and Python's headers alone: the request
loop (shardfs/fuse/lowlevel/*.c), which declares the part of libfuse3 it uses itself
(lowlevel/libfuse.h) and binds the node's libfuse3.so.3 (and zlib's crc32) when shardfs starts, so
it links neither; the tar scanner's fast path (shardfs/formats/_tarscan.c) and the zip directory's
(shardfs/formats/_zipdir.c), which share the names' normal forms (shardfs/formats/_names.h).

One wheel for every CPython from 3.10 (cluster users pick 3.10-3.14 from modules or AppStream):
each extension is built against the limited API of 3.10 (Py_LIMITED_API, see ``ABI3``) and the
wheel is tagged cp310-abi3. The stable ABI keeps such a module loadable on every later CPython;
the loop does not need more of the C API than the limited one gives (its buffer protocol, stable
from 3.11, is declared in shardfs/pybuffer310.h for 3.10, where CPython has the same functions and struct).
A new extension takes ``**ABI3`` too: the wheel has one tag, so every module in it must keep it.

The package's long description (what PyPI shows) is README.md with its relative links made
absolute against the repository named once in pyproject.toml's [project.urls]: relative links
work on the repository's host but lead nowhere on PyPI."""

import os
import platform
import re
import sys

from setuptools import Extension, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # a build requirement there (pyproject.toml)
    import tomli as tomllib

INLINE_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)\)")
HAS_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def absolute_links(markdown: str, repository: str) -> str:
    """markdown with every relative inline link made absolute against repository, laid out as GitHub
    and its kin serve a repository: pages under blob/HEAD/, images under raw/HEAD/, the README's own
    headings on the repository's front page. Fenced code is left as it is."""
    def absolute(m: re.Match) -> str:
        image, text, target = m.groups()
        if HAS_SCHEME.match(target):
            return m.group(0)
        if target.startswith("#"):
            return f"{image}[{text}]({repository}{target})"
        return f"{image}[{text}]({repository}/{'raw' if image else 'blob'}/HEAD/{target.removeprefix('./')})"

    parts = re.split(r"(^```.*?^```[^\n]*$)", markdown, flags=re.M | re.S)
    return "".join(part if part.startswith("```") else INLINE_LINK.sub(absolute, part) for part in parts)


def long_description() -> str:
    with open("pyproject.toml", "rb") as f:
        repository = tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")
    with open("README.md", encoding="utf-8") as f:
        return absolute_links(f.read(), repository)


LOWLEVEL = "shardfs/fuse/lowlevel"
# where lowlevel.h binds dlopen and its kin, and _tarscan.c the thread keys, to their first symbol
# version (glibc on x86_64)
OLD_DLOPEN = platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc"
# the oldest CPython the wheel serves: its limited API (0x030A0000) and its wheel tag (cp310)
ABI3 = {"py_limited_api": True, "define_macros": [("Py_LIMITED_API", "0x030A0000")]}
# SHARDFS_SANITIZE=1: every module built with AddressSanitizer and UndefinedBehaviorSanitizer, any
# undefined behaviour fatal (no recovery); -O1 after each module's own -O (the last one counts) for
# stacks that name the lines. For tests only (tools/sanitized.sh; docs/testing.md says how to run them).
SANITIZE = os.environ.get("SHARDFS_SANITIZE", "") == "1"
SANITIZE_COMPILE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g",
                    "-O1"] if SANITIZE else []
SANITIZE_LINK = ["-fsanitize=address,undefined"] if SANITIZE else []

setup(
    long_description=long_description(),
    long_description_content_type="text/markdown",
    ext_modules=[Extension(
        "shardfs.fuse._lowlevel",
        sources=[f"{LOWLEVEL}/{name}.c" for name in ("libfuse", "slot", "table", "requests", "session")],
        depends=[f"{LOWLEVEL}/lowlevel.h", f"{LOWLEVEL}/libfuse.h", "shardfs/pybuffer310.h"],
        # hidden: only PyInit__lowlevel is exported (nothing of ours can stand in for a libfuse symbol)
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-parameter", "-fvisibility=hidden",
                            "-Werror=implicit-function-declaration"] + SANITIZE_COMPILE,
        # where glibc before 2.34 keeps dlopen and pthread_create (lowlevel.h binds them to their old
        # symbol versions); kept as needed also where the linker would drop them (newer glibc
        # resolves them in libc)
        extra_link_args=(["-Wl,--no-as-needed", "-l:libdl.so.2", "-l:libpthread.so.0"] if OLD_DLOPEN else [])
        + SANITIZE_LINK,
        **ABI3,
    ), Extension(
        "shardfs.formats._tarscan",
        sources=["shardfs/formats/_tarscan.c"],
        depends=["shardfs/pybuffer310.h", "shardfs/formats/_names.h"],
        # -O3: the checksum loop vectorised
        extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-fvisibility=hidden"] + SANITIZE_COMPILE,
        # where glibc before 2.34 keeps the thread keys (_tarscan.c binds them to their old symbol version)
        extra_link_args=(["-Wl,--no-as-needed", "-l:libpthread.so.0"] if OLD_DLOPEN else []) + SANITIZE_LINK,
        **ABI3,
    ), Extension(
        "shardfs.formats._zipdir",
        sources=["shardfs/formats/_zipdir.c"],
        depends=["shardfs/pybuffer310.h", "shardfs/formats/_names.h"],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-fvisibility=hidden"] + SANITIZE_COMPILE,
        extra_link_args=SANITIZE_LINK,
        **ABI3,
    )],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
