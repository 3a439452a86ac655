#!/usr/bin/env bash
# Prometheus, Grafana and Collector files under docs/: installs Debian's prometheus package
# (prometheus and promtool 2.42) when missing, checks the rules' syntax, the Grafana dashboards
# (classic and native-histogram variants) against Grafana's own schema types and the Collector configuration's structure. tests/signals/ then runs `promtool test rules` on series made from
# the emulator's scenarios, and a real Prometheus over those exports that evaluates the rules and
# answers every query of the Grafana dashboard, and one fed native histograms by remote write for
# the native variants (REQUIRE_PROMTOOL=1 makes it fail rather than skip without them). Exits
# non-zero when a tool cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."

. .ci/need.sh

need promtool prometheus "the rules and the dashboard's queries were not checked"
promtool --version | head -n1
promtool check rules docs/prometheus/nccl-rules.yml docs/prometheus/nccl-rules-native.yml

# Grafana cannot be installed here; its schema can: the dashboard must type-check as
# @grafana/schema's Dashboard (string enums taken as their values, unknown fields refused).
need npm npm "the Grafana dashboard was not checked against Grafana's schema"
grafana=$(mktemp -d)
trap 'rm -rf "$grafana"' EXIT
(cd "$grafana" && npm install --silent --no-audit --no-fund @grafana/schema@13.2.3 typescript@7.0.2 >/dev/null) \
  || { echo "FAILED: cannot install @grafana/schema and typescript from npm; the dashboard was not checked"; exit 1; }
# Both dashboards: the classic one and its native-histogram variant.
for json in docs/grafana/nccl-dashboard.json docs/grafana/nccl-dashboard-native.json; do
  {
    echo 'import type { Dashboard } from "@grafana/schema";'
    echo 'type Json<T> = T extends string ? `${T}` : T extends (infer U)[] ? Json<U>[] : T extends object ? { [K in keyof T]: Json<T[K]> } : T;'
    printf 'export const dashboard: Json<Dashboard> = '
    cat "$json"
    echo ';'
  } > "$grafana/dashboard.ts"
  (cd "$grafana" && npx tsc --noEmit --strict --skipLibCheck --module esnext --moduleResolution bundler dashboard.ts) \
    || { echo "$json does not match @grafana/schema's Dashboard (a line of dashboard.ts is the JSON's line + 2)"; exit 1; }
  echo "$json: a Dashboard of @grafana/schema 13.2.3"
done

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
