"""The reference pages generated from the code (scripts/docs_reference): each lists what the
code defines, the settings registry is complete, and rendering needs no database (pytest-django
refuses any query here: no test in this module has database access)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from gateway import choices as gateway_choices
from gateway.lib import env
from sagas import choices as saga_choices
from scripts.docs_reference import GENERATED, api, commands, metrics, renderers, statuses
from scripts.docs_reference import settings as settings_page

ROOT = Path(settings.BASE_DIR)
# The settings and the module it star-imports a section from.
SETTINGS_SOURCES = [ROOT / "gateway" / "settings.py", ROOT / "gateway" / "settings_oauth.py"]
CODE = re.compile(r"`([^`]+)`")


def _env_calls() -> list[ast.Call]:
    return [
        node
        for source in SETTINGS_SOURCES
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.startswith("env_")
        and node.func.id != "env_section"
    ]


def _row(page: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is `first_cell`."""
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell} in the page")


# --- settings ------------------------------------------------------------------------------------


def test_every_environment_read_of_the_settings_has_a_name_and_a_meaning():
    calls = _env_calls()
    assert len(calls) > 50
    for call in calls:
        where = f"gateway/settings.py:{call.lineno}"
        assert call.args and isinstance(call.args[0], ast.Constant), f"{where}: a literal name"
        docs = [kw.value for kw in call.keywords if kw.arg == "doc"]
        assert docs and isinstance(docs[0], ast.Constant) and docs[0].value.strip(), (
            f"{where}: {call.args[0].value} is read without doc= (its meaning in the reference)"
        )


def test_every_environment_read_is_in_the_registry():
    """A variable read only under a condition would be missing from the reference."""
    read = {call.args[0].value for call in _env_calls()}
    assert read == set(env.REGISTRY), (
        f"read but not registered (read them unconditionally): {sorted(read - set(env.REGISTRY))}"
    )


def test_the_settings_never_read_the_environment_past_the_helpers():
    raw = [
        (source.name, node.lineno)
        for source in SETTINGS_SOURCES
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv"})
        or (isinstance(node, ast.Name) and node.id in {"environ", "getenv"})
    ]
    assert raw == [], f"the settings read os.environ themselves at {raw}"


def test_the_settings_page_lists_every_variable_with_its_default_and_meaning():
    page = settings_page.render()
    for setting in env.REGISTRY.values():
        cells = _row(page, f"`{setting.name}`")
        assert cells[1] == setting.kind
        assert setting.doc.split(".")[0].replace("\n", " ") in cells[3]
    assert _row(page, "`GATEWAY_DISPATCH_LEASE`")[2] == "`60`"
    assert _row(page, "`GATEWAY_FAST_PATH`")[2] == "`true`"
    assert "0 turns it off" in _row(page, "`SECURE_HSTS_SECONDS`")[3]


_RENDER_SETTINGS = """
import os, sys
sys.path.insert(0, os.getcwd())
from scripts.docs_reference import setup_django
setup_django()
from scripts.docs_reference import settings
print(settings.render())
"""


def test_the_settings_page_does_not_change_with_the_environment_it_is_built_in():
    """Defaults computed from other settings or the checkout's path say so (``shown=``)."""
    outside = {
        "GATEWAY_PRODUCTION": "true",
        "SECRET_KEY": "another",
        "GATEWAY_AUDIT_SIGNING_KEY": "A" * 43 + "=",
        "GATEWAY_VAR_DIR": "/srv/elsewhere",
        "GATEWAY_TASK_QUEUE": "elsewhere",
        "LOG_LEVEL": "DEBUG",
        "GATEWAY_SANDBOX_URL": "http://sandbox.invalid:1",
    }
    pages = []
    for extra in ({}, outside):
        environment = {key: value for key, value in os.environ.items() if key not in outside}
        done = subprocess.run(
            [sys.executable, "-c", _RENDER_SETTINGS],
            cwd=ROOT,
            env={**environment, "PYTHONWARNINGS": "ignore", **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        pages.append(done.stdout)
    assert pages[0] == pages[1]


def test_a_second_read_of_a_variable_with_another_meaning_is_refused():
    name = "GATEWAY_DOCS_PROBE"
    try:
        env.env_int(name, 3, doc="One meaning.")
        env.env_int(name, 3, doc="One meaning.")
        with pytest.raises(Exception, match=name):
            env.env_int(name, 4, doc="Another default.")
    finally:
        env.REGISTRY.pop(name, None)


# --- statuses ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "choices", "table"),
    [
        ("## Effect statuses", gateway_choices.EffectStatus, gateway_choices.ALLOWED_TRANSITIONS),
        ("## Saga states", saga_choices.SagaState, saga_choices.ALLOWED_TRANSITIONS),
    ],
)
def test_the_statuses_page_shows_each_transition_table_as_it_is(section, choices, table):
    page = statuses.render().split(section)[1].split("\n## ")[0]
    for status in choices:
        targets = set(CODE.findall(_row(page, f"`{status.value}`")[1]))
        assert targets == set(table[status]), status


def test_the_statuses_page_names_the_sets_and_the_other_vocabularies():
    page = statuses.render()
    uncertain = set(CODE.findall(_row(page, "`UNCERTAIN`")[1]))
    assert uncertain == set(gateway_choices.UNCERTAIN)
    assert set(CODE.findall(_row(page, "`ACTIVE`")[1])) == set(saga_choices.ACTIVE)
    assert "### `reconciliation.choices.CaseReason`" in page
    assert "`lookup_budget_exhausted`" in page
    assert "`MANUAL_OUTCOMES`" in page


# --- commands ------------------------------------------------------------------------------------


def test_the_commands_page_shows_every_command_of_the_apps_with_its_arguments():
    page = commands.render()
    found = commands.project_commands()
    assert {"issue_token", "verify_audit", "demo", "rotate_vault_key"} <= set(found)
    for name in found:
        assert f"## {name} {{#" in page
    section = page.split("## issue_token")[1].split("\n## ")[0]
    assert "`--tenant`" in section
    assert "`--settings`" not in section, "Django's common options are named once, above"


# --- metrics -------------------------------------------------------------------------------------


def _modules_defining_metrics() -> set[str]:
    defining = set()
    for app in ("gateway", "reconciliation", "sagas"):
        for path in (ROOT / app).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "prometheus_client" in text and re.search(
                r"\b(Counter|Gauge|Histogram|Summary|Info|Enum|\w+MetricFamily)\(", text
            ):
                defining.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return defining


def test_every_module_that_defines_a_metric_is_imported_by_the_metrics_page():
    assert _modules_defining_metrics() <= set(metrics.METRIC_MODULES)


def test_the_metrics_page_shows_each_metric_with_its_type_and_labels():
    page = metrics.render()
    dispatch = _row(page, "`gateway_dispatch_seconds`")
    assert dispatch[1].startswith("histogram")
    assert dispatch[2] == "`type`, `outcome`"
    effects = _row(page, "`gateway_effects`")
    assert effects[1].startswith("gauge, read from the ledger")
    assert effects[2] == "`status`, `type`"
    assert _row(page, "`gateway_reconcile_lookups_total`")[1] == "counter"


# --- the HTTP API --------------------------------------------------------------------------------


def test_the_api_page_has_every_operation_of_the_schema_and_no_dangling_link():
    document = api.openapi()
    page = api.render()
    for path, item in document["paths"].items():
        for method in api.METHODS:
            if method in item:
                assert f"### `{method.upper()} {path}`" in page
    anchors = set(re.findall(r"\{#([\w-]+)\}", page))
    links = set(re.findall(r"\]\(#([\w-]+)\)", page))
    assert links - anchors == set()
    body = page.split("### `POST /api/v1/commands`")[1].split("\n### ")[0]
    assert "[CommandSubmitRequest](#schema-commandsubmitrequest)" in body
    assert "`Idempotency-Key`" in body


def test_a_page_written_by_hand_where_one_is_generated_stops_the_build(tmp_path):
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    from scripts.docs_reference import hook

    written = File(GENERATED[0], str(tmp_path), str(tmp_path / "site"), False)
    with pytest.raises(PluginError, match=re.escape(f"{GENERATED[0]} is generated")):
        hook.on_files(Files([written]), config=None)  # type: ignore[arg-type]


def test_the_statuses_page_says_what_a_value_means_where_the_code_does():
    page = statuses.render()
    assert "the worker lost its claim; its result was refused" in _row(page, "`stale`")[1]
    uncertain = _row(page, "`UNCERTAIN`")[2]
    assert uncertain.startswith("The outcome is not known to the ledger")


def test_every_generated_page_renders():
    pages = renderers()
    assert tuple(pages) == GENERATED
    for path, render in pages.items():
        text = render()
        assert text.startswith("# "), path
        assert "generated from" in text, path
    json.dumps(api.openapi())  # the schema itself is plain JSON
