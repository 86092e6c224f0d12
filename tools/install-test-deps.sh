#!/usr/bin/env bash
# Installs the system packages the tests need that cargo cannot fetch: Debian's `prometheus`, the
# real Prometheus server runtime/tests/prometheus.rs scrapes the instinct server with. Idempotent
# and quiet when it is there already (or INSTINCT_PROMETHEUS names a binary for the test to use).
# Runs apt-get as root, through sudo when not root.
set -euo pipefail

if [[ -n "${INSTINCT_PROMETHEUS:-}" ]] || command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

fail() {
    echo "install-test-deps: $1; runtime/tests/prometheus.rs needs Debian's \`prometheus\` package" \
        "(or INSTINCT_PROMETHEUS=/path/to/prometheus)" >&2
    exit 1
}
command -v apt-get >/dev/null 2>&1 || fail "no apt-get on this machine"
if [[ "$(id -u)" -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    fail "not root and no sudo to install it with"
fi

echo "install-test-deps: installing prometheus (apt-get)" >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null 2>&1 || fail "apt-get installed no \`prometheus\` command"
