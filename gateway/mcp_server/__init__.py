"""The gateway's MCP server, re-exported from ``effect_gateway_client.mcp_server``
(``effect-gateway-mcp`` once the standalone client is installed). This path stays public:
``python -m gateway.mcp_server`` runs the same server."""

from effect_gateway_client.mcp_server import *  # noqa: F403
from effect_gateway_client.mcp_server import __all__  # noqa: F401
