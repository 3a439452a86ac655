#!/usr/bin/env bash
# libFuzzer under AddressSanitizer over arbitrary NCCL callback streams: the cargo-fuzz
# crate in tests/fuzz, target `callbacks` (bytes -> init/start/state/stop/finalize/poll through the
# exported ncclProfiler_v1 … _v7 table the input picks, with exact accounting; see tests/fuzz/stream.rs).
#
# FUZZ_SECONDS (default 120) bounds the run. Prints the number of callbacks executed; exits non-zero
# on a finding (crash, panic, failed invariant, ASan report, leak, timeout of one input > 10 s, RSS
# > 2 GiB). A finding's input is saved under tests/fuzz/artifacts/callbacks/; reproduce it with
#   cargo +nightly fuzz run callbacks --fuzz-dir tests/fuzz --target-dir target/fuzz <file>
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
seconds="${FUZZ_SECONDS:-120}"

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "SKIPPED: no nightly toolchain on this machine, so the libFuzzer job did not run"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked
fi

corpus=target/fuzz/corpus/callbacks
log=target/fuzz/callbacks.log
mkdir -p "$corpus"
if [ -z "$(ls -A "$corpus")" ]; then
    # Seed: well-formed operations (op 0xff) on every communicator, polls (0xd2) between them.
    seed=""
    for i in $(seq 0 39); do
        seed+="\\xff\\x$(printf %02x $((i % 5)))\\x$(printf %02x $((i * 37 % 256)))\\x0$((i % 4))\\x03\\x05\\x02\\x40\\x00\\x03\\x01\\x02\\x03\\x04"
        [ $((i % 8)) -eq 7 ] && seed+="\\xd2\\x0$((i % 6))"
    done
    printf "$seed" >"$corpus/seed-operations"
fi

# Built apart from the run, so that a build failure is not reported as a finding.
if ! cargo +nightly fuzz build callbacks --fuzz-dir tests/fuzz --target-dir target/fuzz --debug-assertions; then
    echo "fuzz: the fuzz target did not build (above); no input was run"
    exit 1
fi

start=$(date +%s)
set +e
cargo +nightly fuzz run callbacks --fuzz-dir tests/fuzz --target-dir target/fuzz --debug-assertions "$corpus" -- \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
rc=$?
set -e
elapsed=$(($(date +%s) - start))

callbacks=$(sed -n 's/^callbacks executed: \([0-9]*\) in \([0-9]*\) inputs$/\1/p' "$log" | tail -1)
inputs=$(sed -n 's/^callbacks executed: \([0-9]*\) in \([0-9]*\) inputs$/\2/p' "$log" | tail -1)
grep -E '^(Done|stat::)' "$log" || true
if [ "$rc" -ne 0 ]; then
    tail -n 80 "$log"
    echo "fuzz: FINDING (exit $rc) after ${elapsed}s, ${callbacks:-unknown} callbacks before it; full log: $log"
    exit "$rc"
fi
echo "fuzz: ${callbacks:-unknown} callbacks executed in ${inputs:-unknown} inputs, no finding (${elapsed}s)"
