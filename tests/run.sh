#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine, then the tests themselves.
#
#   bash tests/run.sh [pytest args]
#
# Installs the CPU build of torch (never a multi-GB CUDA build on a CPU machine), Spyglass with
# its test extras and the example plugin, g++ for the CPU kernels and Prometheus (Debian packages)
# and Phoenix (its own virtualenv). The tests start and stop Prometheus and Phoenix themselves,
# on 127.0.0.1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python3 -m pip install --quiet torch==2.13.0
python3 -m pip install --quiet -e '.[test]'
for plugin in examples/plugins/*/; do
  [ -f "$plugin/pyproject.toml" ] && python3 -m pip install --quiet -e "$plugin"
done

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v g++ >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus g++ >/dev/null
fi
bash tests/services/start_phoenix.sh --install

python3 -c "from spyglass.core.loaders.default_model import ensure_default_model; ensure_default_model()"
exec python3 -m pytest "$@"
