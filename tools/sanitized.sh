#!/usr/bin/env bash
# The tests that reach the C (the tar scanner, the request loop's table and requests, the tiers,
# mounts of every format) against a copy of this checkout built with AddressSanitizer and
# UndefinedBehaviorSanitizer (setup.py's SHARDFS_SANITIZE=1). Fails if a test fails or if any
# process of the run (pytest, each `shardfs mount` and its daemon, `shardfs umount`) wrote a
# sanitizer report. The checkout's own build is left as it is.
#
#   bash tools/sanitized.sh                      # the default set below
#   bash tools/sanitized.sh --durations=10       # the default set, with these pytest options
#   bash tools/sanitized.sh tests/test_tarscan.py -k plain    # other tests
#
# PYTHON: the interpreter with shardfs's dependencies (default: the checkout's .venv/bin/python that
# tools/setup.sh makes, else python3). SANITIZED_KEEP=1 keeps the
# copy and the reports (their directory is printed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$root/.venv/bin/python" ] && venv_python=$root/.venv/bin/python || venv_python=python3
PYTHON=${PYTHON:-$venv_python}
DEFAULT_TESTS=(
    tests/test_tarscan.py tests/test_fuzz_tar.py tests/test_tar_format.py tests/test_tar_edge_cases.py
    tests/test_lowlevel.py tests/test_saved_view.py tests/test_disk_tier.py tests/test_lz4shard.py
    tests/test_datafiles.py tests/test_imagefolder.py tests/test_posix.py
    tests/test_zip.py tests/test_squashfs.py tests/test_compressed_tars.py
)
# options alone (e.g. --durations=10): the default tests with them
for arg in "$@"; do [ "${arg#-}" != "$arg" ] || { named=1; break; }; done
[ -n "${named:-}" ] || set -- "${DEFAULT_TESTS[@]}" "$@"

work=$(mktemp -d /tmp/shardfs-sanitized.XXXXXX)
if [ "${SANITIZED_KEEP:-0}" = 1 ]; then
    echo "sanitized copy and reports kept in $work"
else
    trap 'rm -rf "$work"' EXIT
fi
copy=$work/src reports=$work/reports
mkdir -p "$copy" "$reports"

# A fresh copy: no build/ and no compiled module of the checkout (setuptools would reuse an
# up-to-date build/ and compile nothing with the sanitizers).
tar -C "$root" --exclude-vcs --exclude=./build --exclude=./.venv --exclude=./site --exclude='*.so' \
    --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis --exclude='*.shardfs-idx' -c . |
    tar -C "$copy" -x
(cd "$copy" && SHARDFS_SANITIZE=1 "$PYTHON" setup.py -q build_ext --inplace --force >"$work/build.log" 2>&1) ||
    { cat "$work/build.log" >&2; echo "sanitized.sh: the sanitized build failed" >&2; exit 1; }
modules=$(find "$copy/shardfs" -name '*.so')
[ -n "$modules" ] || { echo "sanitized.sh: no module was built" >&2; exit 1; }
for so in $modules; do
    nm -D "$so" | grep __asan >/dev/null || { echo "sanitized.sh: $so was built without ASan" >&2; exit 1; }
done

# The runtimes preloaded into every process (ASan first; the interpreter itself is not built with
# them); Python's own allocator off, so that ASan sees each allocation. ASan writes each report to
# a file of its own in $reports (a daemon's stderr is /dev/null until it logs to its file). Leaks
# are not looked for: CPython keeps memory until exit by design, so every run would report them.
# UBSan stops the process at its first report (-fno-sanitize-recover=all, halt_on_error), so the
# test that reached it fails; its report goes to the process's stderr whatever UBSAN_OPTIONS'
# log_path says (with GCC's two runtimes in one process, the report path is set in ASan's runtime
# only, tried here): pytest's own stderr (not captured at the descriptor: --capture=sys) and the
# daemons' logs (in --basetemp) are searched for reports too.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:log_path=$reports/asan:halt_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONMALLOC=malloc PYTHONPATH=$copy
cd "$copy"
set +e
"$PYTHON" -m pytest -q -p no:cacheprovider --capture=sys --basetemp="$work/tmp" "$@" 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e

REPORT='runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer|Sanitizer:DEADLYSIGNAL'
found=$(grep -rlE "$REPORT" --include='*.log' "$work/pytest.log" "$work/tmp" 2>/dev/null || true)
for report in $found "$reports"/*; do
    [ -e "$report" ] || continue
    echo "==== sanitizer report in $report"
    grep -E -A30 "$REPORT" "$report" | head -60
done
if [ -n "$found" ] || [ -n "$(ls -A "$reports")" ]; then
    echo "sanitized.sh: sanitizer reports (above); the copy is in $work" >&2
    trap - EXIT
    exit 1
fi
[ "$status" = 0 ] || echo "sanitized.sh: the tests failed (no sanitizer report)" >&2
exit "$status"
