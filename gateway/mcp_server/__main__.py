"""``python -m gateway.mcp_server``: the same program as ``effect-gateway-mcp``."""

import sys

from effect_gateway_client.mcp_server.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
