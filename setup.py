"""The compiled request loop (shardfs/fuse/lowlevel/*.c), built against libfuse3 by pip install."""

import shlex
import subprocess

from setuptools import Extension, setup


def pkg_config(*args: str) -> list[str]:
    try:
        return shlex.split(subprocess.run(["pkg-config", *args, "fuse3"], check=True, capture_output=True,
                                          text=True).stdout)
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit("shardfs needs libfuse3's headers to build: apt-get install libfuse3-dev pkg-config") from None


setup(ext_modules=[Extension(
    "shardfs.fuse._lowlevel",
    sources=[f"shardfs/fuse/lowlevel/{name}.c" for name in ("slot", "table", "requests", "session")],
    depends=["shardfs/fuse/lowlevel/lowlevel.h"],
    extra_compile_args=pkg_config("--cflags") + ["-O2", "-std=gnu11", "-Wall", "-Wno-unused-parameter"],
    extra_link_args=pkg_config("--libs") + ["-lz"],  # zlib: crc32, as tierfile writes it
)])
