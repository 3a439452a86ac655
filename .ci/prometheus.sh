#!/usr/bin/env bash
# Prometheus, Grafana and Collector files under docs/: installs Debian's prometheus package
# (prometheus and promtool 2.42) when missing, checks the rules' syntax and the Collector
# configuration's structure. tests/signals.rs then runs `promtool test rules` on series made from
# the emulator's scenarios, and a real Prometheus over those exports that evaluates the rules and
# answers every query of the Grafana dashboard (REQUIRE_PROMTOOL=1 makes it fail rather than
# skip without them). Exits non-zero when a tool cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."

. .ci/need.sh

need promtool prometheus "the rules and the dashboard's queries were not checked"
promtool --version | head -n1
promtool check rules docs/prometheus/nccl-rules.yml

python3 -c 'import yaml' 2>/dev/null || pip install -q pyyaml \
  || { echo "FAILED: cannot install PyYAML; docs/collector/otelcol.yaml was not checked"; exit 1; }
# The OpenTelemetry Collector itself cannot be fetched here: check that the configuration parses,
# that its pipeline names only components it defines, and that it listens where the plugin sends.
python3 - docs/collector/otelcol.yaml <<'PY'
import sys, yaml
path = sys.argv[1]
cfg = yaml.safe_load(open(path, encoding="utf-8"))
errors = []
for name, pipe in cfg["service"]["pipelines"].items():
    for kind in ("receivers", "processors", "exporters"):
        for component in pipe.get(kind, []):
            if component not in (cfg.get(kind) or {}):
                errors.append(f"pipeline {name}: {kind[:-1]} {component} is not defined")
protocols = cfg["receivers"]["otlp"]["protocols"]
for proto, port in (("http", "4318"), ("grpc", "4317")):
    if not protocols[proto]["endpoint"].endswith(":" + port):
        errors.append(f"otlp {proto} receiver not on port {port}, the plugin's default")
for e in errors:
    print(f"{path}: {e}")
sys.exit(1 if errors else 0)
PY
echo "docs/collector/otelcol.yaml: pipeline components defined, OTLP on 4317 and 4318"
