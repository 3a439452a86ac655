#!/usr/bin/env bash
# The loom models (src/buffer/loom.rs, src/telemetry/consumer/loom.rs): the library's unit tests, built by
# `cargo rustc` with `--cfg nccl_loom` for this crate alone (it reaches only the final rustc), in
# the bench profile, so they reuse the release dependencies the soak and callgrind steps built;
# RUSTFLAGS would rebuild every dependency. The `loom` feature brings in the loom crate.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0

exe=$(cargo rustc --profile bench --lib --features loom --message-format=json-render-diagnostics \
    -- --cfg nccl_loom | python3 -c '
import json, sys
exes = [m["executable"] for m in map(json.loads, sys.stdin)
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]]
print(exes[-1] if exes else "")')
[ -n "$exe" ] || { echo "cargo rustc built no unit-test executable of the library"; exit 1; }
"$exe" loom::
