"""Regenerate the console screenshots the docs show (``make screenshots``).

The pictures are taken by the console's browser tests (Debian's chromium driven by
Playwright, against a live server over the test database and the real sandbox provider):
this runs them with ``CONSOLE_SCREENSHOTS=docs/screenshots``, so each picture is of a page the
tests have just checked. Then it compares what was written with what the docs show: an image
a page shows that no test wrote this time is an error (it would drift from the product); an
image no page shows is listed.

    python scripts/screenshots.py [pytest arguments]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
# The tests that take the pictures (tests/console/test_browser.py, the `shots` fixture).
TESTS = ("tests/console/test_browser.py", "tests/console/test_console_flows.py")
IMAGE = re.compile(r"screenshots/([\w.-]+\.png)")


def shown_in_docs() -> dict[str, list[str]]:
    """Each screenshot the docs and the README show, with the files that show it."""
    shown: dict[str, list[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in IMAGE.findall(page.read_text(encoding="utf-8")):
            shown.setdefault(name, []).append(str(page.relative_to(ROOT)))
    return shown


def compare(started: float) -> int:
    """Report the pictures the docs show that this run did not write; 1 if there are any."""
    shown = shown_in_docs()
    written = {path.name for path in SHOTS.glob("*.png") if path.stat().st_mtime >= started}
    missing = {name: pages for name, pages in shown.items() if name not in written}
    unused = sorted(path.name for path in SHOTS.glob("*.png") if path.name not in shown)
    print(f"==> {len(written)} screenshots written to {SHOTS.relative_to(ROOT)}/")
    if unused:
        print("note: no page shows these (delete them, or show them):")
        print("".join(f"  {name}\n" for name in unused), end="")
    if missing:
        print("error: the docs show these, and no test wrote them:", file=sys.stderr)
        for name, pages in sorted(missing.items()):
            print(f"  {name} (in {', '.join(pages)})", file=sys.stderr)
        return 1
    return 0


def main(arguments: list[str]) -> int:
    if not CHROMIUM.exists():
        print(f"error: {CHROMIUM} is missing: make browser (or apt-get install chromium)")
        return 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    # Whole seconds: a file system may keep modification times coarser than time.time().
    started = float(int(time.time()))
    command = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", *TESTS]
    done = subprocess.run(
        [*command, *arguments],
        cwd=ROOT,
        env={**os.environ, "CONSOLE_SCREENSHOTS": str(SHOTS)},
        check=False,
    )
    if done.returncode != 0:
        print("error: the browser tests failed; the screenshots may be partial", file=sys.stderr)
        return done.returncode
    return compare(started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
