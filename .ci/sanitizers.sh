#!/usr/bin/env bash
# AddressSanitizer and ThreadSanitizer over the concurrency tests, with the nightly
# toolchain these machines carry. No rust-src here, so no -Zbuild-std: std stays uninstrumented,
# which needs `-Cunsafe-allow-abi-mismatch=sanitizer` to link and gives ThreadSanitizer false
# positives that tests/tsan.supp suppresses one by one (docs/reliability.md explains each line).
#
# Runs: the window/comm/consumer/stats unit tests, tests/plugin_rules.rs, tests/zero_alloc.rs (ASan only),
# tests/fuzz_callbacks.rs, tests/lifecycle/ (but for its own-process modules), tests/emulator_scenarios.rs
# and tests/abi/ (v7: the 2.31 profiler thread). Scaled for time:
# PROPTEST_CASES (default 64) and LIFECYCLE_EVENTS (default 300) may be overridden.
# SANITIZERS="address thread" chooses which run. Exits non-zero on any report or test failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "SKIPPED: no nightly toolchain on this machine, so the AddressSanitizer and ThreadSanitizer jobs did not run"
    exit 0
fi
host=$(rustc +nightly -vV | sed -n 's/^host: //p')
export PROPTEST_CASES="${PROPTEST_CASES:-64}" LIFECYCLE_EVENTS="${LIFECYCLE_EVENTS:-300}"

# `--test NAME` for each integration test in $@ that exists (the emulator's may be absent).
tests() {
    for t in "$@"; do
        if [ -f "tests/$t.rs" ] || [ -f "tests/$t/main.rs" ]; then printf -- '--test\n%s\n' "$t"; fi
    done
}
# Left out: the ABI layout (no plugin code runs) and lifecycle's modules that run in a process
# of their own (`disabled`; `telemetry_idle` times its thread).
skip=(-- --skip layout:: --skip disabled:: --skip telemetry_idle::)

run() {
    local sanitizer=$1
    shift
    # --export-dynamic: the test executables carry the sanitizer runtime; the instrumented
    # libnccl_profiler_otel.so they dlopen (lifecycle, emulator) resolves its hooks from them.
    RUSTFLAGS="-Zsanitizer=$sanitizer -Cunsafe-allow-abi-mismatch=sanitizer -Clink-arg=-Wl,--export-dynamic -Cdebuginfo=1" \
    RUSTDOCFLAGS="-Zsanitizer=$sanitizer -Cunsafe-allow-abi-mismatch=sanitizer" \
    CARGO_TARGET_DIR="target/$sanitizer" SANITIZER="$sanitizer" \
        cargo +nightly test --target "$host" --no-fail-fast "$@"
}

status=0
for sanitizer in ${SANITIZERS:-address thread}; do
    start=$(date +%s)
    printf '\n=== %sSanitizer (%s)\n' "$sanitizer" "$(date -u +%H:%M:%S)"
    case "$sanitizer" in
    address)
        # Leak detection on: the plugin's type-stable allocations are reachable from statics.
        export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=1:strict_string_checks=1"
        run address --lib -- window:: comm:: telemetry::consumer:: stats:: handle:: || status=1
        mapfile -t args < <(tests plugin_rules zero_alloc fuzz_callbacks lifecycle emulator_scenarios abi)
        run address "${args[@]}" "${skip[@]}" || status=1
        ;;
    thread)
        export TSAN_OPTIONS="suppressions=$PWD/tests/tsan.supp:report_signal_unsafe=0:history_size=4:second_deadlock_stack=1"
        run thread --lib -- window:: comm:: telemetry::consumer:: stats:: || status=1
        # zero_alloc is left out: one thread counting its own allocations, nothing to race.
        mapfile -t args < <(tests plugin_rules fuzz_callbacks lifecycle emulator_scenarios abi)
        run thread "${args[@]}" "${skip[@]}" || status=1
        ;;
    *)
        echo "unknown sanitizer $sanitizer" >&2
        status=1
        ;;
    esac
    printf '=== %sSanitizer took %ss\n' "$sanitizer" "$(($(date +%s) - start))"
done
exit $status
