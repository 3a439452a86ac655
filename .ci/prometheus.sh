#!/usr/bin/env bash
# Prometheus for the alerting rules in docs/prometheus: installs Debian's prometheus package
# (promtool 2.42) when promtool is missing, and checks the rules' syntax. tests/signals.rs then
# runs `promtool test rules` on series made from the emulator's scenarios (REQUIRE_PROMTOOL=1
# makes it fail rather than skip without promtool). Exits non-zero when promtool cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."

. .ci/need.sh

need promtool prometheus "the rules were not checked"
promtool --version | head -n1
promtool check rules docs/prometheus/nccl-rules.yml
