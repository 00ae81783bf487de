"""The real Claude Code CLI (npm, pinned in tests/integrations/claude_code/) for the tests and
``scripts/check_real_clients.py``: installed from its lock file into the tools' cache (never the
checkout), run with ``-p`` in a project holding the docs' configs verbatim."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINNED = ROOT / "tests" / "integrations" / "claude_code"
DOC = ROOT / "docs" / "guides" / "integrations.md"
EXAMPLE = re.compile(r"<!-- example: ([a-z0-9-]+) -->\n```(\w+)\n(.*?)\n```", re.S)


class Missing(RuntimeError):
    """Node.js or npm is not installed."""


def doc_example(name: str) -> str:
    """The fenced block after ``<!-- example: name -->`` in docs/guides/integrations.md."""
    found = {marker: code for marker, _, code in EXAMPLE.findall(DOC.read_text())}
    return found[name]


def install() -> Path:
    """The pinned CLI's ``claude`` program, installed with ``npm ci`` when missing."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise Missing("Node.js is not installed")
    lock = json.loads((PINNED / "package-lock.json").read_text())
    version = lock["packages"]["node_modules/@anthropic-ai/claude-code"]["version"]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "effect-gateway" / f"claude-code-{version}"
    binary = home / "node_modules" / ".bin" / "claude"
    done = home / ".installed"  # written once `npm ci` has finished, never before
    home.mkdir(parents=True, exist_ok=True)
    # Test processes running side by side: one installs, the others wait for it, and none
    # runs the program while `npm ci` is still writing it.
    with open(home.parent / f"{home.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if not done.exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copy(PINNED / name, home / name)
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=home,
                check=True,
                capture_output=True,
                timeout=600,
            )
            done.touch()
    return binary


def project(into: Path, settings: str) -> Path:
    """A project holding the docs' ``.mcp.json`` and the docs' ``settings`` example as its
    ``.claude/settings.json``, and a bin directory with ``effect-gateway-mcp`` as installing the
    client puts it on PATH."""
    where = into / "project"
    (where / ".claude").mkdir(parents=True)
    (where / ".mcp.json").write_text(doc_example("claude-code-mcp"))
    (where / ".claude" / "settings.json").write_text(doc_example(settings))
    bin_dir = into / "bin"
    bin_dir.mkdir()
    mcp = bin_dir / "effect-gateway-mcp"
    mcp.write_text(f'#!/bin/sh\nexec {sys.executable} -m effect_gateway_client.mcp_server "$@"\n')
    mcp.chmod(0o755)
    return where


def run(
    claude: Path, where: Path, *, gateway_url: str, token: str, model_url: str, prompt: str
) -> dict:
    """``claude -p`` in ``where`` as the docs run it, against the model at ``model_url``; its
    JSON result."""
    home = where.parent / "home"
    home.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "GATEWAY_URL": gateway_url,
        "GATEWAY_TOKEN": token,
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "PYTHONPATH": f"{ROOT / 'clients' / 'python' / 'src'}:{ROOT}",
        "PATH": f"{where.parent / 'bin'}:{os.environ['PATH']}",
    }
    result = subprocess.run(
        [str(claude), "-p", prompt, "--mcp-config", ".mcp.json", "--output-format", "json"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"claude -p exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return json.loads(result.stdout)
