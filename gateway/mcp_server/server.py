"""Moved to ``effect_gateway_client.mcp_server.server``; this path names the same module."""

import sys

from effect_gateway_client.mcp_server import server as _module

sys.modules[__name__] = _module
