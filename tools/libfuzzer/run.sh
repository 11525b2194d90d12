#!/usr/bin/env bash
# Builds the libFuzzer targets with clang's ASan and UBSan and runs each in turn for SECONDS:
# tarscan.c (the tar scanner's C) from small seed tars written by Python's tarfile (USTAR, GNU,
# PAX, a ustar prefix), zipdir.c (the zip directory's C) from central directories of zips written
# by zipfile (plain, UTF-8, folders, odd names):
#   bash tools/libfuzzer/run.sh [SECONDS] [libFuzzer options...]      (default 60 s a target)
# Needs Debian's clang-14 and libclang-rt-14-dev (tools/setup.sh installs them). A crash or a
# failed check stops it with a non-zero status and leaves the input in tools/libfuzzer/findings/
# (crash-*, timeout-*): to replay one, build as below and run the binary on that file alone.
# A campaign in pieces: CORPUS_DIR=DIR keeps each target's corpus in DIR/corpus-TARGET (a piece starts
# from what the last one grew, not from the seeds alone); TARGETS="zipdir" runs only the named ones.
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
targets=${TARGETS:-tarscan zipdir}
corpus=${CORPUS_DIR:-$work}
for target in $targets; do
    case $target in tarscan|zipdir) ;; *) echo "run.sh: no libFuzzer target '$target' (tarscan, zipdir)" >&2; exit 2 ;; esac
done
include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_path("include"))')
libdir=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
pylib=$("$PYTHON" -c 'import sysconfig; print("python" + sysconfig.get_config_var("LDVERSION"))')
# (libpython only for the module's own functions, which the target never calls)
for target in $targets; do
    clang-14 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I"$include" \
        "$here/$target.c" -o "$work/$target" -L"$libdir" -Wl,-rpath,"$libdir" -l"$pylib"
done
mkdir -p "$corpus/corpus-tarscan" "$corpus/corpus-zipdir"
mkdir -p "$here/findings"
"$PYTHON" - "$corpus/corpus-tarscan" "$corpus/corpus-zipdir" <<'PY'
import io, os, struct, sys, tarfile, zipfile
out, zips = sys.argv[1], sys.argv[2]
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
def central(name, members):
    """The zip's central directory, after the entry count its end record gives (two bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in members:
            z.writestr(path, data)
    raw = buf.getvalue()
    count, size, at = struct.unpack_from("<HII", raw, len(raw) - 22 + 10)
    with open(os.path.join(zips, name), "wb") as f:
        f.write(struct.pack("<H", count) + raw[at : at + size])
central("plain", [("cls/a.jpg", b"a"), ("cls/b.jpg", b"b"), ("other/c.jpg", b"c")])
central("folders", [("d/", b""), ("d/e/", b""), ("d/e/f.txt", b"f")])
central("odd", [("./x/../y", b"1"), ("\u00e9t\u00e9/a", b"2"), ("a//b", b"3"), ("../up", b"4")])
PY
cd "$here/findings"
for target in $targets; do
    echo "== $target"
    "$work/$target" "$corpus/corpus-$target" -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 "$@"
done
