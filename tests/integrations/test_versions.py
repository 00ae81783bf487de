"""One version number for what an agent developer installs and talks to: the server package,
the Python client, the TypeScript client, the MCP server's serverInfo and the API's schema."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import effect_gateway_client
from effect_gateway_client.mcp_server import GatewayTools, build_server

ROOT = Path(__file__).resolve().parents[2]


def test_every_published_part_carries_one_version(client):
    version = effect_gateway_client.__version__
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    client_pyproject = tomllib.loads((ROOT / "clients/python/pyproject.toml").read_text())
    package = json.loads((ROOT / "clients/typescript/package.json").read_text())
    lock = json.loads((ROOT / "clients/typescript/package-lock.json").read_text())
    shipped_schema = json.loads((ROOT / "clients/typescript/openapi.json").read_text())
    tools = GatewayTools("http://127.0.0.1:9", token="egw_unused")
    try:
        server_info = build_server(tools).create_initialization_options().server_version
    finally:
        tools.close()
    served = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert {
        "server package": pyproject["project"]["version"],
        "python client": client_pyproject["project"]["version"],
        "typescript client": package["version"],
        "typescript lock": lock["version"],
        "mcp serverInfo": server_info,
        "api schema": served["info"]["version"],
        "schema the typescript client ships": shipped_schema["info"]["version"],
    } == dict.fromkeys(
        [
            "server package",
            "python client",
            "typescript client",
            "typescript lock",
            "mcp serverInfo",
            "api schema",
            "schema the typescript client ships",
        ],
        version,
    )
