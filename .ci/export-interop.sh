#!/usr/bin/env bash
# Interop of the OTLP export with a real collector: installs rotel (PyPI `rotel`, which ships the
# `rotel-agent` OpenTelemetry collector), then runs tests/export/rotel.rs, where the plugin exports
# OTLP/HTTP to rotel-agent and rotel forwards to the test's own receiver. Exits non-zero when rotel
# cannot be installed or the metrics do not arrive intact.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -m pip install --quiet --pre rotel; then
  echo "FAILED: cannot install rotel from PyPI (pip install --pre rotel); the interop check did not run"
  exit 1
fi
ROTEL_AGENT=$("$PYTHON" -c 'import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), "rotel-agent"))')
if [ ! -x "$ROTEL_AGENT" ]; then
  echo "FAILED: rotel is installed but $ROTEL_AGENT is not an executable; the interop check did not run"
  exit 1
fi
echo "rotel-agent: $ROTEL_AGENT ($("$ROTEL_AGENT" --version 2>&1 | head -n1))"

ROTEL_AGENT="$ROTEL_AGENT" cargo test --test export -- --ignored --nocapture rotel::
