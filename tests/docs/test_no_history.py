"""The docs, the README and the code's comments and docstrings describe the product as it is
now: none of them tells development history ("session 12", "round 3", "issue 31", "this
session"). That story belongs in CHANGELOG.md and in git. Django's own session vocabulary
(``request.session``, session cookies, ``SESSION_*``) and round trips are not history."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Read whole: every word of these is prose a reader sees.
PROSE = ["README.md", "docs/**/*.md"]
# Python: only comments and docstrings (string literals are behaviour, not narrative).
PYTHON = [
    "gateway",
    "reconciliation",
    "sagas",
    "clients/python/src",
    "scripts",
    "tests/benchmarks",
]
# Read whole: templates, the console's own JS and CSS, shell scripts and the Makefile, whose
# text is comments, markup and help strings.
TEXT = ["templates/**/*.html", "static/*.js", "static/*.css", "scripts/*.sh", "Makefile"]

_NUMBER = r"#?\d+(?!\.\d)"  # not a decimal: "load during the rounds 3.3–15.5"
_NOT_A_TRIP = r"(?![\s-]*trips?\b)"
HISTORY = re.compile(
    "|".join(
        [
            # session 12, sessions 5–7, Session 6's
            rf"\bsessions?\s+{_NUMBER}",
            # round 3, Round N, rounds 2 and 3 — but not a `--rounds 3` option
            rf"(?<![\w-])rounds?\s+(?:{_NUMBER}|N\b)",
            # issue 31, issue #31, (issue 12, item 3)
            rf"\bissues?\s+{_NUMBER}",
            # this session, an earlier session, the last round (not a round trip)
            rf"\b(?:this|that|earlier|previous|last|next|same|first)\s+(?:session|round){_NOT_A_TRIP}\b",
        ]
    ),
    re.IGNORECASE,
)


def history_in(text: str) -> list[str]:
    """The phrases of ``text`` that tell development history."""
    return [match.group(0) for match in HISTORY.finditer(text)]


def _python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python module."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                text = first.value.value
                yield first.lineno, text if isinstance(text, str) else ""


def _files(patterns: list[str]) -> Iterator[Path]:
    for pattern in patterns:
        yield from sorted(path for path in ROOT.glob(pattern) if path.is_file())


def _python_files() -> Iterator[Path]:
    for folder in PYTHON:
        yield from sorted((ROOT / folder).rglob("*.py"))


def hits() -> list[str]:
    """Every place in the product that tells history, as ``path:line: phrase``."""
    found = []
    for path in [*_files(PROSE), *_files(TEXT)]:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            found += [f"{path.relative_to(ROOT)}:{number}: {p}" for p in history_in(line)]
    for path in _python_files():
        for number, text in _python_prose(path.read_text()):
            # A docstring spans lines: report each phrase at the line it starts on, plus offset.
            for offset, line in enumerate(text.splitlines()):
                found += [
                    f"{path.relative_to(ROOT)}:{number + offset}: {p}" for p in history_in(line)
                ]
    return found


def test_the_product_tells_no_development_history():
    found = hits()
    assert not found, (
        "development history in the product (move it to CHANGELOG.md or a commit message):\n"
        + "\n".join(found)
    )


def test_every_place_it_reads_exists():
    """A renamed folder must not silently empty the check."""
    assert (ROOT / "docs" / "index.md").is_file()
    for folder in PYTHON:
        assert any((ROOT / folder).rglob("*.py")), folder
    assert any(_files(["templates/**/*.html"])) and any(_files(["static/*.js"]))


@pytest.mark.parametrize(
    "text",
    [
        "Where it stands (2026-12-03, session 15)",
        "sessions 5–7 measured it",
        "Session 6's harness",
        "Round 3: the web tier",
        "### Round N",
        "rounds 2 and 3 agreed",
        "(issue 12, item 3)",
        "see issue #31",
        "Issues 12 and 13",
        "as measured in an earlier session",
        "this session's runs",
        "the last round showed",
    ],
)
def test_history_is_found(text):
    assert history_in(text), text


@pytest.mark.parametrize(
    "text",
    [
        "request.session['tenant'] = tenant.pk",
        "SESSION_COOKIE_SECURE = True",
        "SESSION_COOKIE_AGE = 1209600",
        "Django sessions with CSRF on every form; session auth only with CSRF",
        "the Claude Code session_id of the hook's input",
        "manage.py bench --rounds 3 --concurrency 8",
        "3 round trips and 3 commits per effect",
        "a drain's last round trip",
        "issue_token --tenant demo",
        "one round of 160 effects",
        "load during the rounds 3.3–15.5",
    ],
)
def test_product_vocabulary_is_not_history(text):
    assert not history_in(text), text
