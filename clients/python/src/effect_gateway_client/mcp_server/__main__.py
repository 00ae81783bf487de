"""``effect-gateway-mcp`` (or ``python -m effect_gateway_client.mcp_server``).

stdio (default): the token comes from ``GATEWAY_TOKEN`` (preferred: a ``--token`` argument is
visible to every user of the machine in the process list). Logs go to stderr; on stdio, stdout
is the protocol.

``--transport streamable-http``: serves ``http://HOST:PORT/mcp``; every request must carry
``Authorization: Bearer <gateway token>`` and acts with that token (401 otherwise). No token
of the server's own is used, so reaching the port gives nothing without a token. Against DNS
rebinding (the MCP transport specification asks servers to check it), a request whose
``Host`` is not the server's own (421) or whose ``Origin`` is another site's (403) is refused
before anything else: the server's own names are HOST:PORT, localhost:PORT, 127.0.0.1:PORT
and [::1]:PORT; ``--allowed-host`` and ``--allowed-origin`` (repeatable, or comma-separated
in GATEWAY_MCP_ALLOWED_HOSTS / GATEWAY_MCP_ALLOWED_ORIGINS) add the names a reverse proxy or
a browser-based client uses.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import anyio.to_thread

from effect_gateway_client import AuthenticationFailed, GatewayError
from effect_gateway_client.mcp_server.server import GatewayTools, bearer_token, build_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="effect-gateway-mcp", description=__doc__)
    parser.add_argument(
        "--gateway-url",
        default=os.environ.get("GATEWAY_URL", "http://127.0.0.1:8000"),
        help="the gateway's base URL (env GATEWAY_URL; default http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("GATEWAY_TOKEN", ""),
        help="stdio: the agent's gateway token (env GATEWAY_TOKEN, preferred)",
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
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=_env_list("GATEWAY_MCP_ALLOWED_HOSTS"),
        help="streamable-http: another Host header to accept, e.g. mcp.example.com (repeatable)",
    )
    parser.add_argument(
        "--allowed-origin",
        action="append",
        default=_env_list("GATEWAY_MCP_ALLOWED_ORIGINS"),
        help="streamable-http: a browser Origin to accept, e.g. https://app.example.com",
    )
    return parser.parse_args(argv)


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def security_settings(
    host: str, port: int, *, hosts: Sequence[str] = (), origins: Sequence[str] = ()
) -> Any:
    """The MCP SDK's DNS-rebinding protection for this server's own names and the extra ones."""
    from mcp.server.transport_security import TransportSecuritySettings

    names = {host, "localhost", "127.0.0.1", "[::1]"}
    own = [f"{name}:{port}" for name in sorted(names)]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*own, *hosts],
        allowed_origins=[*(f"http://{name}" for name in own), *origins],
    )


def http_app(tools: GatewayTools, security: Any = None) -> Any:
    """The streamable-HTTP ASGI app: Host/Origin check, bearer check, then the SDK's session
    manager (which checks Host/Origin again with the same settings)."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecurityMiddleware
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=build_server(tools), security_settings=security)
    guard = TransportSecurityMiddleware(security)

    def unauthorized(detail: str) -> JSONResponse:
        return JSONResponse(
            {"error": "invalid_token", "error_description": detail},
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="effect-gateway"'},
        )

    async def mcp_endpoint(scope, receive, send) -> None:
        refused = await guard.validate_request(Request(scope), is_post=False)
        if refused is not None:  # another site's page, or a rebound DNS name
            await refused(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        token = bearer_token(headers.get("authorization"))
        if not token:
            response = unauthorized("send Authorization: Bearer <your gateway token>")
            await response(scope, receive, send)
            return
        try:
            # Checked against the gateway (and the token's tools cached) before the session.
            await anyio.to_thread.run_sync(tools.catalogue, token)
        except AuthenticationFailed as error:
            await unauthorized(f"the gateway refused this token: {error.detail}")(
                scope, receive, send
            )
            return
        except GatewayError as error:
            response = JSONResponse({"error": "gateway_unavailable", "detail": error.detail}, 502)
            await response(scope, receive, send)
            return
        await manager.handle_request(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(app) -> AsyncIterator[None]:
        async with manager.run():
            yield

    class Endpoint:
        # A plain ASGI app (not a function): Starlette routes it as is, at /mcp exactly
        # (a Mount would redirect /mcp to /mcp/).
        async def __call__(self, scope, receive, send) -> None:
            await mcp_endpoint(scope, receive, send)

    return Starlette(routes=[Route("/mcp", endpoint=Endpoint())], lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("LOG_LEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.transport == "stdio":
        if not args.token:
            print("error: set GATEWAY_TOKEN to the agent's gateway token", file=sys.stderr)
            return 2
        tools = GatewayTools(
            args.gateway_url, token=args.token, agent=args.agent, timeout=args.timeout
        )
        try:
            tools.catalogue()
        except GatewayError as exc:
            print(
                f"error: cannot read {args.gateway_url}/api/v1/effect-types: {exc}",
                file=sys.stderr,
            )
            return 2
        server = build_server(tools)
        from mcp.server.stdio import stdio_server

        async def run_stdio() -> None:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())

        try:
            anyio.run(run_stdio)
        finally:
            tools.close()
        return 0
    import uvicorn

    tools = GatewayTools(args.gateway_url, agent=args.agent, timeout=args.timeout)
    security = security_settings(
        args.host, args.port, hosts=args.allowed_host, origins=args.allowed_origin
    )
    try:
        app = http_app(tools, security)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        tools.close()
    return 0


def entry() -> None:
    """The ``effect-gateway-mcp`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
