#!/usr/bin/env bash
# Builds the libFuzzer target tarscan.c (the tar scanner's C) with clang's ASan and UBSan and runs
# it from small seed tars written by Python's tarfile (USTAR, GNU, PAX, a ustar prefix):
#   bash tools/libfuzzer/run.sh [SECONDS] [libFuzzer options...]      (default 60 s)
# Needs Debian's clang-14 and libclang-rt-14-dev (tools/setup.sh installs them). A crash or a
# failed check stops it with a non-zero status and leaves the input in tools/libfuzzer/findings/
# (crash-*, timeout-*): to replay one, build as below and run the binary on that file alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
seconds=${1:-60}  # (0 would mean no limit to libFuzzer)
[ "$seconds" -gt 0 ]
shift || true
# the checkout's venv (tools/setup.sh), else python3
[ -x "$here/../../.venv/bin/python" ] && venv_python=$here/../../.venv/bin/python || venv_python=python3
PYTHON=${PYTHON:-$venv_python}
work=$(mktemp -d /tmp/shardfs-libfuzzer.XXXXXX)
trap 'rm -rf "$work"' EXIT
include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("include"))')
libdir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
pylib=$("$PYTHON" -c 'import sysconfig; print("python" + sysconfig.get_config_var("LDVERSION"))')
# (libpython only for the module's own functions, which the target never calls)
clang-14 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I"$include" \
    "$here/tarscan.c" -o "$work/tarscan" -L"$libdir" -Wl,-rpath,"$libdir" -l"$pylib"
mkdir -p "$work/corpus" "$here/findings"
"$PYTHON" - "$work/corpus" <<'PY'
import io, os, sys, tarfile
out = sys.argv[1]
def tar(name, fmt, members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for path, data, kind in members:
            info = tarfile.TarInfo(path)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "a.txt"
            else:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    with open(os.path.join(out, name), "wb") as f:
        f.write(buf.getvalue())
plain = [("cls/a.txt", b"a" * 10, tarfile.REGTYPE), ("cls/", b"", tarfile.DIRTYPE),
         ("./x/y/z.jpg", b"J" * 700, tarfile.REGTYPE), ("l", b"", tarfile.SYMTYPE)]
tar("ustar", tarfile.USTAR_FORMAT, plain)
tar("gnu", tarfile.GNU_FORMAT, plain + [("n" * 150 + "/long", b"L", tarfile.REGTYPE)])
tar("pax", tarfile.PAX_FORMAT, plain + [("p/\u00e9", b"P", tarfile.REGTYPE)])
tar("prefix", tarfile.USTAR_FORMAT, [("d" * 120 + "/" + "e" * 60, b"E", tarfile.REGTYPE)])
PY
cd "$here/findings"
"$work/tarscan" "$work/corpus" -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 "$@"
