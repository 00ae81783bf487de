"""The Effect Gateway as an MCP server: ``effect-gateway-mcp`` (extra ``mcp``).

One tool per effect type the token may submit (from ``GET /api/v1/effect-types``) and read
tools to follow effects, all through the gateway's HTTP API, over stdio or streamable HTTP.
"""

from effect_gateway_client.mcp_server.server import (
    SERVER_NAME,
    GatewayTools,
    build_server,
    tool_name,
)

__all__ = ["SERVER_NAME", "GatewayTools", "build_server", "tool_name"]
