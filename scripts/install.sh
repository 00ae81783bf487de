#!/usr/bin/env bash
# Build VENV (default .venv) and install the project with its dev extra into it (make install).
#
# Says what it is doing and how long each step took: creating the virtualenv, upgrading pip,
# then the dependencies one line each as pip collects them (pip's own lines, each prefixed with
# the seconds since the start, its noise dropped). $PYTHON picks the interpreter for a new
# virtualenv (scripts/find_python.sh). Exits with pip's status when pip fails.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv}
PY=$VENV/bin/python
START=$SECONDS

say() { printf '==> %s\n' "$*"; }
took() { printf '    done in %d s\n' "$((SECONDS - $1))"; }

# pip's lines, shortened for people: the install lists name every package on one line.
present() {
    local line count
    while IFS= read -r line; do
        case $line in
            "WARNING: Location '"*"' is ignored"* | "Looking in "* | "Requirement already satisfied"* | "Using cached"* | "  Preparing"* | "  Getting requirements"* | \
                "  Installing build dependencies"* | "  Checking if build backend"* | "  Created wheel"* | \
                "  Stored in directory"* | "Building wheels for collected"* | "Successfully built"* | \
                "  Building editable for"* | "  Obtaining"* | "  Attempting uninstall"* | \
                "    Found existing installation"* | "    Uninstalling"* | "      Successfully uninstalled"*)
                continue
                ;;
            "Installing collected packages: "*)
                count=$(tr -cd ',' <<<"${line#*: }" | wc -c)
                line="Installing $((count + 1)) packages into $VENV (the longest step; pip prints nothing while it runs)"
                ;;
            "Successfully installed "*)
                count=$(wc -w <<<"${line#Successfully installed }")
                line="Successfully installed $count packages"
                ;;
        esac
        printf '    [%4d s] %s\n' "$((SECONDS - START))" "$line"
    done
}

step=$SECONDS
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    py="$(bash scripts/find_python.sh)"
    say "creating $VENV with $py ($("$py" --version 2>&1))"
    rm -rf "$VENV"
    "$py" -m venv "$VENV"
    took "$step"
fi

step=$SECONDS
say "upgrading pip in $VENV"
"$PY" -m pip install --quiet --upgrade pip
took "$step"

step=$SECONDS
say "installing the project and its dev extra into $VENV (a few minutes on a first install)"
# setuptools warns on every editable install that local folders may shadow the package.
PYTHONWARNINGS="ignore:Editable installation" "$PY" -m pip install --progress-bar off -e '.[dev]' 2>&1 \
    | present
took "$step"
say "installed in $((SECONDS - START)) s"
