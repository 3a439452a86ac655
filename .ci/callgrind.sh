#!/usr/bin/env bash
# Instructions per callback under valgrind's callgrind (benches/callgrind.rs): a deterministic
# guard that a noisy machine cannot flake. Installs Debian's valgrind when missing; fails when a
# callback kind adds more instructions than its ceiling, or when valgrind cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never CARGO_INCREMENTAL=0
. .ci/need.sh

need valgrind valgrind "instructions per callback not counted"
valgrind --version
cargo bench --bench callgrind
