"""``effect-gateway-mcp`` (or ``python -m effect_gateway_client.mcp_server``).

stdio (default): the token comes from ``GATEWAY_TOKEN`` (preferred: a ``--token`` argument is
visible to every user of the machine in the process list). Logs go to stderr; on stdio, stdout
is the protocol.

``--transport streamable-http``: serves ``http://HOST:PORT/mcp``; every request must carry
``Authorization: Bearer <token>`` and acts with that token (401 otherwise): a gateway API
token, or an OAuth access token the gateway issued for this endpoint. The endpoint is an OAuth
protected resource (the MCP authorization specification): a 401 carries
``WWW-Authenticate: Bearer resource_metadata="…"``, pointing at its RFC 9728 metadata
(``/.well-known/oauth-protected-resource`` and ``…/oauth-protected-resource/mcp``), which
names the gateway as the authorization server. ``--resource-url`` is the endpoint's public
URL (default ``http://HOST:PORT/mcp``; behind a proxy, the proxy's); the gateway's
``GATEWAY_OAUTH_RESOURCES`` must list it. No token of the server's own is used, so reaching
the port gives nothing without a token. Against DNS
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
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread

from effect_gateway_client import AuthenticationFailed, GatewayError
from effect_gateway_client.mcp_server.server import GatewayTools, bearer_token, build_server

PRM_PATH = "/.well-known/oauth-protected-resource"


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
    parser.add_argument(
        "--resource-url",
        default=os.environ.get("GATEWAY_MCP_RESOURCE_URL") or None,
        help="streamable-http: this endpoint's public URL, its OAuth resource "
        "(env GATEWAY_MCP_RESOURCE_URL; default http://HOST:PORT/mcp)",
    )
    parser.add_argument(
        "--authorization-server",
        default=os.environ.get("GATEWAY_MCP_AUTHORIZATION_SERVER") or None,
        help="streamable-http: the gateway's public URL, where OAuth clients get tokens "
        "(env GATEWAY_MCP_AUTHORIZATION_SERVER; default the --gateway-url)",
    )
    return parser.parse_args(argv)


def resource_metadata(resource_url: str, authorization_server: str) -> dict[str, Any]:
    """The endpoint's OAuth protected-resource metadata (RFC 9728)."""
    return {
        "resource": resource_url,
        "authorization_servers": [authorization_server.rstrip("/")],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["mcp"],
        "resource_name": "Effect Gateway MCP server",
    }


def resource_metadata_url(resource_url: str) -> str:
    """Where the metadata of ``resource_url`` is (RFC 9728 §3.1: the well-known path, then
    the resource's own path)."""
    parts = urlsplit(resource_url)
    return f"{parts.scheme}://{parts.netloc}{PRM_PATH}{parts.path.rstrip('/')}"


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


def challenge(resource_url: str, detail: str, *, token_given: bool) -> Any:
    """The 401 of the endpoint. RFC 6750 §3: no error code when no token came; the metadata
    link either way, so an OAuth client finds the authorization server (the MCP
    authorization specification)."""
    from starlette.responses import JSONResponse

    header = f'Bearer resource_metadata="{resource_metadata_url(resource_url)}"'
    if token_given:
        header += f', error="invalid_token", error_description={json.dumps(detail)}'
    return JSONResponse(
        {"error": "invalid_token", "error_description": detail},
        status_code=401,
        headers={"WWW-Authenticate": header},
    )


def metadata_routes(resource_url: str, metadata: dict[str, Any]) -> list[Any]:
    """The protected-resource metadata at the well-known path, bare and with the resource's
    own path (``/mcp``, or the path a proxy maps)."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def protected_resource(request: Request) -> Response:
        # Public metadata: any page may read it (browser-based MCP clients).
        return JSONResponse(metadata, headers={"Access-Control-Allow-Origin": "*"})

    paths = {PRM_PATH, f"{PRM_PATH}/mcp"}
    resource_path = urlsplit(resource_url).path.rstrip("/")
    if resource_path:
        paths.add(f"{PRM_PATH}{resource_path}")
    return [Route(path, endpoint=protected_resource, methods=["GET"]) for path in sorted(paths)]


def http_app(
    tools: GatewayTools,
    security: Any = None,
    *,
    resource_url: str = "http://127.0.0.1:8808/mcp",
    authorization_server: str | None = None,
) -> Any:
    """The streamable-HTTP ASGI app: its protected-resource metadata; for /mcp the Host/Origin
    check, the bearer check, then the SDK's session manager (which checks Host/Origin again
    with the same settings)."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecurityMiddleware
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    manager = StreamableHTTPSessionManager(app=build_server(tools), security_settings=security)
    guard = TransportSecurityMiddleware(security)
    metadata = resource_metadata(resource_url, authorization_server or tools.base_url)
    unauthorized = partial(challenge, resource_url)

    async def mcp_endpoint(scope, receive, send) -> None:
        refused = await guard.validate_request(Request(scope), is_post=False)
        if refused is not None:  # another site's page, or a rebound DNS name
            await refused(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        token = bearer_token(headers.get("authorization"))
        if not token:
            response = unauthorized(
                "send Authorization: Bearer <a gateway or OAuth token>", token_given=False
            )
            await response(scope, receive, send)
            return
        try:
            # Asked of the gateway at every request (a revoked token stops at once); the
            # token's tools are cached for the session's calls.
            await anyio.to_thread.run_sync(partial(tools.catalogue, token, fresh=True))
        except AuthenticationFailed as error:
            await unauthorized(f"the gateway refused this token: {error.detail}", token_given=True)(
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

    routes = [Route("/mcp", endpoint=Endpoint()), *metadata_routes(resource_url, metadata)]
    return Starlette(routes=routes, lifespan=lifespan)


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

    resource_url = args.resource_url or f"http://{args.host}:{args.port}/mcp"
    tools = GatewayTools(
        args.gateway_url, agent=args.agent, timeout=args.timeout, resource=resource_url
    )
    security = security_settings(
        args.host, args.port, hosts=args.allowed_host, origins=args.allowed_origin
    )
    try:
        app = http_app(
            tools,
            security,
            resource_url=resource_url,
            authorization_server=args.authorization_server,
        )
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        tools.close()
    return 0


def entry() -> None:
    """The ``effect-gateway-mcp`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
