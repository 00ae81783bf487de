#!/usr/bin/env bash
# `make dist`: the clients' release files, built from copies of their sources (a build writes
# build/, *.egg-info and dist/ into the tree it builds in; the checkout keeps none of them).
#   DIR/effect_gateway_client-<v>-py3-none-any.whl and .tar.gz   (python -m build)
#   DIR/effect-gateway-client-<v>.tgz                              (npm pack)
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:?usage: dist.sh OUTPUT_DIR}")"
py="${PY:-.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

echo "==> the Python client: wheel and sdist"
mkdir -p "$work/python"
tar -C clients/python --exclude=build --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude=dist -cf - . | tar -C "$work/python" -xf -
"$py" -m build --sdist --wheel --outdir "$out" "$work/python" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; exit 1; }
grep -E "^Successfully" "$work/build.log"
ls "$out"/effect_gateway_client-*.whl "$out"/effect_gateway_client-*.tar.gz >/dev/null

if command -v npm >/dev/null; then
    echo "==> the TypeScript client: npm tarball"
    [[ -x clients/typescript/node_modules/.bin/tsc ]] \
        || (cd clients/typescript && npm ci --no-audit --no-fund --silent)
    mkdir -p "$work/typescript"
    tar -C clients/typescript --exclude=node_modules --exclude=dist --exclude=dist-test \
        --exclude='*.tgz' -cf - . | tar -C "$work/typescript" -xf -
    ln -s "$PWD/clients/typescript/node_modules" "$work/typescript/node_modules"
    (cd "$work/typescript" && npm pack --silent --pack-destination "$out" >/dev/null)
    ls "$out"/effect-gateway-client-*.tgz >/dev/null
else
    echo "note: npm is missing: no npm tarball" >&2
fi
echo "==> release files in $out:"
ls -1 "$out"
