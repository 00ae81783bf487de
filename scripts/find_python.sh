#!/usr/bin/env bash
# Print the absolute path of a Python >= 3.12 that can build a virtualenv.
#
# Candidates are RUN, not just looked up: on machines with pyenv, `python3.13` on PATH may be
# a shim that exits with "command not found" unless PYENV_VERSION is set, so only an
# interpreter that actually starts and reports a good version counts.
# Order: python3.13, python3.12, pyenv's installed 3.13.x and 3.12.x (newest first), then
# plain python3. $PYTHON, when set, is the only candidate. Diagnostics go to stderr; exit 1
# when none works.
set -euo pipefail

MIN_VERSION="3.12"

# A candidate passes when it starts, is >= 3.12 and can create a venv with pip in it
# (Debian splits `ensurepip` into the python3.X-venv package).
probe='
import sys
if sys.version_info < (3, 12):
    sys.exit(3)
try:
    import ensurepip, venv
except ImportError:
    sys.exit(4)
print(sys.executable)
'

pyenv_root() {
    if command -v pyenv >/dev/null 2>&1; then
        pyenv root 2>/dev/null && return
    fi
    echo "${PYENV_ROOT:-${HOME:-/root}/.pyenv}"
}

candidates=()
if [[ -n "${PYTHON:-}" ]]; then
    candidates+=("$PYTHON") # an explicit choice is the only candidate: no silent fallback
else
    candidates+=(python3.13 python3.12)
    root="$(pyenv_root)"
    for series in 3.13 3.12; do
        # Newest patch release first (compgen prints nothing when the series is not installed).
        while IFS= read -r dir; do
            candidates+=("$dir/bin/python3")
        done < <(compgen -G "$root/versions/$series*" | sort -rV || true)
    done
    candidates+=(python3)
fi

rejected=()
for candidate in "${candidates[@]}"; do
    if ! command -v "$candidate" >/dev/null 2>&1; then
        [[ "$candidate" == "${PYTHON:-}" ]] && rejected+=("  $candidate: not found")
        continue # an absent default candidate is not worth a line
    fi
    out="$("$candidate" -c "$probe" </dev/null 2>/dev/null)" && status=0 || status=$?
    if ((status == 0)) && [[ -n "$out" ]]; then
        echo "$out"
        exit 0
    fi
    case $status in
        3) rejected+=("  $candidate: older than $MIN_VERSION ($("$candidate" --version 2>&1 </dev/null))") ;;
        4) rejected+=("  $candidate: has no venv/ensurepip (Debian: apt-get install python3.X-venv)") ;;
        *) rejected+=("  $candidate: does not run (exit $status; a pyenv shim without PYENV_VERSION?)") ;;
    esac
done

{
    echo "error: no usable Python >= $MIN_VERSION found (Django 6 needs it)."
    if ((${#rejected[@]})); then
        echo "Tried:"
        printf '%s\n' "${rejected[@]}"
    fi
    echo "Install Python 3.12 or 3.13, for example:"
    echo "  apt-get install python3.12 python3.12-venv     (Debian/Ubuntu)"
    echo "  pyenv install 3.13                             (pyenv)"
    echo "or point at one explicitly: make install PYTHON=/path/to/python3.13"
} >&2
exit 1
