"""The TypeScript client for the tests, built and packed outside the checkout (a build writes
dist/ where it runs; ``make test`` leaves nothing in the checkout)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
TSC = PACKAGE / "node_modules" / ".bin" / "tsc"


def toolchain() -> None:
    """Node.js, and the package's own dev dependencies (its node_modules: an install)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed")
    if not TSC.exists():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=PACKAGE,
            check=True,
            capture_output=True,
            timeout=300,
        )


def build_tests(out: Path) -> Path:
    """The package's sources and tests compiled into ``out``; its test directory."""
    toolchain()
    subprocess.run(
        [str(TSC), "-p", "tsconfig.test.json", "--outDir", str(out)],
        cwd=PACKAGE,
        check=True,
        timeout=300,
    )
    return out / "test"


def pack(into: Path) -> Path:
    """``npm pack`` of a copy of the package (its prepack builds dist/ in the copy)."""
    toolchain()
    copy = into / "package"
    shutil.copytree(
        PACKAGE,
        copy,
        ignore=shutil.ignore_patterns("node_modules", "dist", "dist-test", "*.tgz"),
    )
    (copy / "node_modules").symlink_to(PACKAGE / "node_modules", target_is_directory=True)
    packed = subprocess.run(
        ["npm", "pack", "--json", "--pack-destination", str(into)],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return into / json.loads(packed.stdout)[0]["filename"]


def installed_project(into: Path) -> Path:
    """An empty npm project with the packed tarball installed, as a user's would be."""
    tarball = pack(into)
    app = into / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True}))
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--offline", str(tarball)],
        cwd=app,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return app
