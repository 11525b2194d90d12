"""The compiled request loop (shardfs/fuse/lowlevel/*.c) and the tar scanner's fast path
(shardfs/formats/_tarscan.c): built by pip install with a C compiler and Python's headers alone. It declares the part of libfuse3 it uses itself (lowlevel/libfuse.h) and
binds the node's libfuse3.so.3 (and zlib's crc32) when shardfs starts, so it links neither."""

import platform

from setuptools import Extension, setup

LOWLEVEL = "shardfs/fuse/lowlevel"
# where lowlevel.h binds dlopen and its kin to their first symbol version (glibc on x86_64)
OLD_DLOPEN = platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc"

setup(ext_modules=[Extension(
    "shardfs.fuse._lowlevel",
    sources=[f"{LOWLEVEL}/{name}.c" for name in ("libfuse", "slot", "table", "requests", "session")],
    depends=[f"{LOWLEVEL}/lowlevel.h", f"{LOWLEVEL}/libfuse.h"],
    # hidden: only PyInit__lowlevel is exported (nothing of ours can stand in for a libfuse symbol)
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wno-unused-parameter", "-fvisibility=hidden"],
    # where glibc before 2.34 keeps dlopen (lowlevel.h binds it to its old symbol version); kept
    # as needed also where the linker would drop it (newer glibc resolves dlopen in libc)
    extra_link_args=["-Wl,--no-as-needed", "-l:libdl.so.2"] if OLD_DLOPEN else [],
), Extension(
    "shardfs.formats._tarscan",
    sources=["shardfs/formats/_tarscan.c"],
    py_limited_api=True,  # the file defines Py_LIMITED_API (3.10)
    extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-fvisibility=hidden"],  # -O3: the checksum loop vectorised
)])
