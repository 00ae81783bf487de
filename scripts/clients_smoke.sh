#!/usr/bin/env bash
# The clients' own checks, each in its own cached environment (make clients-test):
#  1. effect-gateway-client's wheel (scripts/dist.sh, as `make dist` builds it) installed into
#     .venv-clients/ beside
#     openai-agents, langchain-mcp-adapters and langgraph, without Django; a smoke test.
#  2. the TypeScript client's unit tests with the machine's Node.js.
# The venv is rebuilt only when clients/python/pyproject.toml or this script changes; the
# client itself is reinstalled on every run (seconds), so the current code is what is tested.
# Builds happen outside the source tree (pip builds a source tree in place, tsc writes dist/):
# the checkout keeps only the venv and node_modules, which `make clean` removes.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

VENV=.venv-clients
STAMP=$VENV/.installed
# Where the sdist `pipx run` installs is copied: a fixed place, so `pipx run` below keeps
# reusing its cached environment.
SRC=$VENV/src
FRAMEWORKS=(openai-agents==0.24.0 langchain-mcp-adapters==0.3.2 langgraph==1.2.22 pipx==1.18.4)
quiet() { "$@" 2>&1 | sed -u "/^WARNING: Location '.*' is ignored/d"; }

fresh=0
if [[ ! -f $STAMP || clients/python/pyproject.toml -nt $STAMP || $0 -nt $STAMP ]]; then
    py="$(bash scripts/find_python.sh)"
    echo "==> building $VENV with $py (the client beside ${FRAMEWORKS[*]})"
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    quiet "$VENV/bin/python" -m pip install --quiet --upgrade pip
    fresh=1
fi
# The release files, as `make dist` builds them: what users install is what is tested.
PY="${PY:-.venv/bin/python}" bash scripts/dist.sh "$work/dist" >/dev/null
wheel="$(ls "$work"/dist/effect_gateway_client-*.whl)"
sdist="$(ls "$work"/dist/effect_gateway_client-*.tar.gz)"
if ((fresh)); then
    quiet "$VENV/bin/python" -m pip install --quiet "$wheel[all]" "${FRAMEWORKS[@]}"
    touch "$STAMP"
fi
quiet "$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$wheel"
"$VENV/bin/python" -m pip check
"$VENV/bin/python" clients/python/tests/smoke.py
echo "wheel $(basename "$wheel"): ok"
# As users run it: `pipx run` on the sdist (its own throwaway environment, cached under
# $VENV/pipx; the sdist is copied to a fixed place so the cache is reused).
mkdir -p "$SRC"
cp "$sdist" "$SRC/effect_gateway_client.tar.gz"
PIPX_HOME="$PWD/$VENV/pipx" PIPX_BIN_DIR="$PWD/$VENV/pipx/bin" \
    "$VENV/bin/pipx" run --spec "./$SRC/effect_gateway_client.tar.gz[mcp]" effect-gateway-mcp --help \
    | grep -q "streamable-http" && echo "pipx run effect-gateway-mcp (sdist): ok"

if command -v node >/dev/null && command -v npm >/dev/null; then
    cd clients/typescript
    [[ -x node_modules/.bin/tsc ]] || npm ci --no-audit --no-fund --silent
    # npm test, with the compiled files out of the checkout.
    node_modules/.bin/tsc -p tsconfig.test.json --outDir "$work/dist-test"
    node --test "$work/dist-test/test/"
else
    echo "note: Node.js is missing; the TypeScript client's tests were not run" >&2
fi
