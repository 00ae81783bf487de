"""The ``effect-gateway-mcp`` console script: the MCP server, or a plain word on what is missing.

The server needs the ``mcp`` extra (the MCP SDK, uvicorn, starlette); installed without it,
the script says how to install it instead of a traceback.
"""

from __future__ import annotations

import sys

INSTALL = (
    "error: effect-gateway-mcp needs the client's mcp extra, which is not installed here "
    "({missing}).\n"
    "  pip install 'effect-gateway-client[mcp]'\n"
    "  or run it without installing: uvx --from 'effect-gateway-client[mcp]' effect-gateway-mcp"
)


def entry() -> None:
    try:
        from effect_gateway_client.mcp_server.__main__ import main
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] in {"mcp", "anyio", "uvicorn", "starlette",
                                                       "jsonschema", "pydantic"}:  # fmt: skip
            print(INSTALL.format(missing=f"no module {error.name!r}"), file=sys.stderr)
            sys.exit(2)
        raise
    sys.exit(main())
