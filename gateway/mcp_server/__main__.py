"""``python -m gateway.mcp_server --gateway-url URL [--transport stdio|streamable-http]``.

The token comes from ``GATEWAY_TOKEN`` (preferred: a ``--token`` argument is visible to every
user of the machine in the process list). Logs go to stderr; on stdio, stdout is the protocol.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import anyio

from gateway.client import GatewayClient, GatewayError
from gateway.mcp_server.server import build_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway.mcp_server", description=__doc__)
    parser.add_argument(
        "--gateway-url",
        default=os.environ.get("GATEWAY_URL", "http://127.0.0.1:8000"),
        help="the gateway's base URL (env GATEWAY_URL; default http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GATEWAY_TOKEN", ""),
        help="the agent's gateway token (env GATEWAY_TOKEN, preferred)",
    )
    parser.add_argument(
        "--agent",
        default=os.environ.get("GATEWAY_AGENT_NAME") or None,
        help="agent name stored in each command's context (default: the MCP client's name)",
    )
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="streamable-http bind address")
    parser.add_argument("--port", type=int, default=8808, help="streamable-http port")
    parser.add_argument("--timeout", type=float, default=15.0, help="gateway request timeout")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not args.token:
        print("error: set GATEWAY_TOKEN (or --token) to the agent's gateway token", file=sys.stderr)
        return 2
    client = GatewayClient(args.gateway_url, args.token, timeout=args.timeout)
    try:
        effect_types = client.effect_types()
    except GatewayError as exc:
        print(f"error: cannot read {args.gateway_url}/api/v1/effect-types: {exc}", file=sys.stderr)
        return 2
    server = build_server(client, effect_types, agent=args.agent)
    try:
        if args.transport == "stdio":
            from mcp.server.stdio import stdio_server

            async def run_stdio() -> None:
                async with stdio_server() as (read_stream, write_stream):
                    await server.run(
                        read_stream, write_stream, server.create_initialization_options()
                    )

            anyio.run(run_stdio)
        else:
            import uvicorn

            app = server.streamable_http_app(host=args.host)
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
