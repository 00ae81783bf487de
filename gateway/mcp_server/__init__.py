"""The Effect Gateway as an MCP server: ``python -m gateway.mcp_server``.

One tool per effect type (generated from ``GET /api/v1/effect-types``) and read tools to
follow effects, all through the gateway's HTTP API. Needs the ``integrations`` extra (``mcp``).
"""

from gateway.mcp_server.server import SERVER_NAME, build_server, tool_name

__all__ = ["SERVER_NAME", "build_server", "tool_name"]
