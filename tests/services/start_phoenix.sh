#!/usr/bin/env bash
# Start a local Arize Phoenix for the end-to-end tracing tests, on loopback only.
#
#   tests/services/start_phoenix.sh            # install if needed, then serve in the foreground
#   tests/services/start_phoenix.sh --install  # only create/refresh the virtualenv
#
# The virtualenv lives at ${SPYGLASS_PHOENIX_VENV:-/opt/spyglass-phoenix} (arize-phoenix and
# arize-phoenix-client from pip; about two minutes and 1 GB the first time). Phoenix serves its UI
# and OTLP/HTTP (POST /v1/traces) on 127.0.0.1:${PHOENIX_PORT:-6006} and OTLP/gRPC on
# 127.0.0.1:${PHOENIX_GRPC_PORT:-4317}. PHOENIX_HOST only governs the HTTP server; Phoenix binds gRPC
# to every interface with no setting to change it, so phoenix_loopback.py rewrites that bind.
# Data goes to ${PHOENIX_WORKING_DIR:-a fresh temporary directory}.
set -euo pipefail

venv="${SPYGLASS_PHOENIX_VENV:-/opt/spyglass-phoenix}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! "$venv/bin/python" -c "import phoenix, phoenix.client" 2>/dev/null; then
  echo "installing Phoenix into $venv ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet arize-phoenix arize-phoenix-client
fi
[ "${1:-}" = "--install" ] && exit 0

export PHOENIX_HOST=127.0.0.1
export PHOENIX_PORT="${PHOENIX_PORT:-6006}"
export PHOENIX_GRPC_PORT="${PHOENIX_GRPC_PORT:-4317}"
export PHOENIX_WORKING_DIR="${PHOENIX_WORKING_DIR:-$(mktemp -d -t spyglass-phoenix.XXXXXX)}"
export PHOENIX_TELEMETRY_ENABLED=false
exec "$venv/bin/python" "$here/phoenix_loopback.py" serve
