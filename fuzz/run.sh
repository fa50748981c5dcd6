#!/bin/sh
# fuzz/run.sh: builds the libFuzzer targets of every parser of the C core
# (fuzz/*_fuzz.c) with clang, ASan and UBSan, and runs each for
# FUZZ_SECONDS seconds on a copy of its seed corpus (build/fuzz/corpus/).
#
#   sh fuzz/run.sh                      every target, 60 s each (make fuzz)
#   FUZZ_SECONDS=10 sh fuzz/run.sh      what CI runs
#   FUZZ_TARGETS="json wire" sh fuzz/run.sh
#   FUZZ_JOBS=1 sh fuzz/run.sh          one build and one run at a time
#                                       (default: one per CPU; each target
#                                       still gets its FUZZ_SECONDS)
#
# Prints one line per target (runs, coverage, features, result) and exits non-zero
# when a target does not build, or any run ends in a crash, a leak, a
# sanitizer report or a broken invariant; the input that did it is kept in
# build/fuzz/artifacts/ (replay: build/fuzz/bin/<target> <file>).
# Installs the compiler's libFuzzer runtime (libclang-rt-N-dev) when missing.
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
LUA_PC=${LUA_PC:-lua5.4}
OUT=build/fuzz
ALL_TARGETS="json json_encode b64 wire chan agent http list tree connect ndjson sse eventstream listing msgpack proto"
TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}

# The largest input each format needs: JSON up to the 1000-deep nesting limit,
# agent streams of several frames, the rest a few kilobytes.
max_len() {
    case "$1" in
        json) echo 8192 ;;
        agent) echo 16384 ;;
        chan) echo 8192 ;;
        b64) echo 2048 ;;
        *) echo 4096 ;;
    esac
}

CC=${FUZZ_CC:-}
if [ -z "$CC" ]; then
    if command -v clang >/dev/null 2>&1; then CC=clang
    elif command -v clang-14 >/dev/null 2>&1; then CC=clang-14
    fi
fi

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else echo "fuzz: need root to run: $*" >&2; return 1
    fi
}

apt_install() {
    echo "fuzz: installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ -z "$CC" ]; then
    apt_install clang-14 libclang-rt-14-dev || exit 2
    CC=clang-14
fi

mkdir -p "$OUT/bin" "$OUT/corpus" "$OUT/artifacts" "$OUT/logs"

# libFuzzer's runtime comes in a package of its own (libclang-rt-<major>-dev).
probe="$OUT/probe"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$probe.c"
if ! "$CC" -fsanitize=fuzzer,address,undefined -o "$probe" "$probe.c" >/dev/null 2>&1; then
    major=$("$CC" -dumpversion | cut -d. -f1)
    apt_install "libclang-rt-$major-dev" || exit 2
    if ! "$CC" -fsanitize=fuzzer,address,undefined -o "$probe" "$probe.c"; then
        echo "fuzz: $CC cannot link a libFuzzer target" >&2
        exit 2
    fi
fi
rm -f "$probe" "$probe.c"

# The Makefile's include and link flags (pkg-config), with the fuzzing sanitizers; the core includes
# the C that protoc-c makes of proto/ (the Makefile's rule makes it).
make --no-print-directory build/gen/proto/.made >/dev/null || exit 2
DEPS_CFLAGS="$($PKG_CONFIG --cflags "$LUA_PC" libuv libcurl libcjson libwebsockets msgpack libprotobuf-c) -Ibuild/gen/proto" || exit 2
DEPS_LIBS="$($PKG_CONFIG --libs "$LUA_PC") $($PKG_CONFIG --libs libuv libcurl libcjson libwebsockets msgpack libprotobuf-c) -l$LUA_PC-luv -lm"
CFLAGS="-std=gnu11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
-fno-sanitize-recover=all -Wall -Wextra -Wno-unused-function $DEPS_CFLAGS -DMAYURA_FUZZ_ROOT=\"$ROOT\""

# Each target is one translation unit (most include the whole core): FUZZ_JOBS compile at once.
failed=0
for t in $TARGETS; do
    if [ ! -f "fuzz/${t}_fuzz.c" ]; then
        echo "fuzz: no target '$t' (have: $ALL_TARGETS)" >&2
        failed=1
    fi
done
[ "$failed" -eq 0 ] || exit 1
# shellcheck disable=SC2090
export CC CFLAGS DEPS_LIBS OUT
# shellcheck disable=SC2016,SC2086
printf '%s\n' $TARGETS | xargs -P "$FUZZ_JOBS" -I{} sh -c \
    '$CC $CFLAGS -o "$OUT/bin/$1" "fuzz/$1_fuzz.c" $DEPS_LIBS || { echo "fuzz: $1 does not build" >&2; exit 1; }' _ {} ||
    failed=1
[ "$failed" -eq 0 ] || exit 1

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# One run of a target; its verdict line goes to $OUT/logs/<target>.line, and the file
# $OUT/logs/<target>.failed says it failed.
fuzz_one() {
    t=$1
    corpus="$OUT/corpus/$t"
    log="$OUT/logs/$t.log"
    rm -f "$OUT/logs/$t.line" "$OUT/logs/$t.failed"
    mkdir -p "$corpus"
    if [ -d "fuzz/corpus/$t" ]; then cp -R "fuzz/corpus/$t/." "$corpus/"; fi
    dict=""
    if [ -f "fuzz/$t.dict" ]; then dict="-dict=fuzz/$t.dict"; fi
    case "$t" in connect|ndjson|sse|eventstream) dict="-dict=fuzz/stream.dict" ;; esac
    # shellcheck disable=SC2086
    "$OUT/bin/$t" "$corpus" $dict -max_total_time="$FUZZ_SECONDS" -max_len="$(max_len "$t")" \
        -timeout=25 -rss_limit_mb=3072 -print_final_stats=1 \
        -artifact_prefix="$OUT/artifacts/$t-" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    result=ok
    if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:|fuzz invariant broken' "$log"; then
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        why=$(grep -m1 -oE 'ERROR: [A-Za-z]+: [a-z-]+|runtime error: .*|fuzz invariant broken: .*' "$log" | cut -c1-80)
        result="FAILED ($why) ${artifact:-see $log}"
        : >"$OUT/logs/$t.failed"
    fi
    printf '%-12s %12s %8s %8s %8s  %s\n' "$t" "${runs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "$result" >"$OUT/logs/$t.line"
}

# FUZZ_JOBS targets at a time (libFuzzer runs one thread), each for its FUZZ_SECONDS; the lines
# are printed in the targets' order.
printf '%-12s %12s %8s %8s %8s  %s\n' target runs exec/s cov ft result
running=0
for t in $TARGETS; do
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$FUZZ_JOBS" ]; then wait; running=0; fi
done
wait
for t in $TARGETS; do
    cat "$OUT/logs/$t.line" 2>/dev/null || { echo "$t: no result" ; failed=1; }
    [ ! -f "$OUT/logs/$t.failed" ] || failed=1
done
exit "$failed"
