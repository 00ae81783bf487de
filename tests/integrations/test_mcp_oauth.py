"""Remote MCP with OAuth 2.1, as the MCP authorization specification describes it: the
streamable-HTTP server (``effect-gateway-mcp``, a real process) is a protected resource, the
gateway (live_server) its authorization server. The MCP SDK's own OAuth client
(``OAuthClientProvider``) discovers both, registers itself, and an admin approves it on the
console's authorize page (driven over real HTTP); then a tool call lands once at the sandbox."""

from __future__ import annotations

import base64
import hashlib
import secrets
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from gateway.choices import Role
from gateway.models import Command, OAuthConnection, Principal
from tests.support.mcp import free_port, streamable_http_mcp

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
CALLBACK = "http://127.0.0.1:9/callback"


@pytest.fixture
def mcp_url(gateway_url, settings):
    """``effect-gateway-mcp`` over streamable HTTP; the gateway issues tokens for it and for
    one other endpoint (``settings.OTHER_RESOURCE``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    settings.GATEWAY_OAUTH_RESOURCES = [url, "http://127.0.0.1:9/other/mcp"]
    with streamable_http_mcp(gateway_url, port=port):
        yield url


@pytest.fixture
def admin_person(db) -> Principal:
    """A tenant admin who signs in to the console as ``root@acme``."""
    from tests.conftest import issue_token

    issue_token("acme", "root", "admin", password=PASSWORD)
    return Principal.objects.select_related("user", "tenant").get(tenant__slug="acme", name="root")


@pytest.fixture
def bot(admin_person) -> Principal:
    """An agent without any grant: what a client acting as it may do is chosen on approval."""
    return Principal.objects.create(tenant=admin_person.tenant, name="mcp-bot", role=Role.AGENT)


class Form(HTMLParser):
    """The inputs of the authorize page's form."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self.action: str | None = None

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "form" and values.get("id") == "authorizationForm":
            self.action = values.get("action") or ""
        if tag == "input" and values.get("type") == "hidden" and values.get("name"):
            self.fields[values["name"]] = values.get("value") or ""


async def approve_in_console(
    authorization_url: str, *, admin: Principal, principal: Principal, grant: list[str]
) -> tuple[str, str | None]:
    """What the admin does in a browser: open the URL, sign in, approve. Answers the code
    and state the client's redirect URI receives."""
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as browser:
        page = await browser.get(authorization_url)
        assert page.status_code == 302 and "/login" in page.headers["location"]
        login_url = httpx.URL(authorization_url).join(page.headers["location"])
        login_page = await browser.get(login_url)
        signed_in = await browser.post(
            login_url,
            data={
                "username": admin.user.username,
                "password": PASSWORD,
                "next": parse_qs(login_url.query.decode())["next"][0],
                "csrfmiddlewaretoken": login_page.cookies.get("csrftoken")
                or browser.cookies["csrftoken"],
            },
        )
        assert signed_in.status_code == 302, signed_in.text
        consent = await browser.get(login_url.join(signed_in.headers["location"]))
        assert consent.status_code == 200, consent.text
        assert "Test connector" in consent.text and CALLBACK in consent.text
        form = Form()
        form.feed(consent.text)
        answer = await browser.post(
            consent.url,
            data={
                **form.fields,
                "allow": "on",
                "principal": str(principal.pk),
                "grant_effect_types": grant,
            },
        )
        assert answer.status_code == 302, answer.text
        location = answer.headers["location"]
        assert location.startswith(CALLBACK), location
        query = parse_qs(urlsplit(location).query)
        return query["code"][0], query.get("state", [None])[0]


class MemoryStorage:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


def provider_for(mcp_url: str, storage: MemoryStorage, admin: Principal, bot: Principal):
    codes: list[tuple[str, str | None]] = []

    async def redirect_handler(authorization_url: str) -> None:
        codes.append(
            await approve_in_console(authorization_url, admin=admin, principal=bot, grant=GRANT)
        )

    async def callback_handler() -> tuple[str, str | None]:
        return codes.pop()

    return OAuthClientProvider(
        server_url=mcp_url,
        client_metadata=OAuthClientMetadata(
            client_name="Test connector",
            redirect_uris=[CALLBACK],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )


GRANT = ["ticket.create"]
TICKET = {
    "idempotency_key": "ticket.create:support:oauth:v1",
    "resource": {"type": "queue", "id": "support"},
    "payload": {"title": "from a remote MCP client", "priority": "P3"},
}


def mcp_session(mcp_url: str, **client_options):
    async def main(work):
        http = httpx.AsyncClient(trust_env=False, timeout=30, **client_options)
        async with (
            http,
            streamable_http_client(mcp_url, http_client=http) as (read, write, _),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            return await work(client)

    return main


def test_the_sdk_oauth_flow_end_to_end(
    mcp_url, gateway_url, admin_person, bot, sandbox, eager_tasks
):
    storage = MemoryStorage()
    provider = provider_for(mcp_url, storage, admin_person, bot)

    async def work(client):
        tools = {t.name for t in (await client.list_tools()).tools}
        first = await client.call_tool("ticket_create", TICKET)
        again = await client.call_tool("ticket_create", TICKET)
        refund = await client.call_tool("billing_refund_create", {})
        return tools, first, again, refund

    tools, first, again, refund = anyio.run(mcp_session(mcp_url, auth=provider), work)
    # The tools of exactly the grant chosen on approval, and the read tools.
    assert tools == {"ticket_create", "get_effect", "list_effects", "wait_for_effect"}
    assert not first.isError and not again.isError
    assert again.structuredContent["replayed"] is True
    assert refund.isError  # not granted: no such tool for this client
    command = Command.objects.get(pk=first.structuredContent["effect_id"])
    assert command.requested_by_id == bot.pk  # acted as the approved principal
    assert len(sandbox.operations(type="ticket.create")) == 1  # once, by the oracle

    connection = OAuthConnection.objects.get(principal=bot)
    assert connection.application.name == "Test connector"
    assert storage.tokens is not None and storage.tokens.refresh_token

    # A refresh token gets a new access token bound to the same endpoint.
    refreshed = httpx.post(
        f"{gateway_url}/oauth/token/",
        data={
            "grant_type": "refresh_token",
            "refresh_token": storage.tokens.refresh_token,
            "client_id": connection.application.client_id,
        },
        trust_env=False,
    )
    assert refreshed.status_code == 200, refreshed.text
    fresh = refreshed.json()["access_token"]
    assert mcp_post(mcp_url, fresh).status_code == 200

    # The admin disconnects the client in the console: its tokens stop at once.
    console = Client()
    console.force_login(admin_person.user)
    listing = console.get("/mcp-clients")
    assert listing.status_code == 200 and "Test connector" in listing.text
    assert console.post(f"/mcp-clients/{connection.pk}/revoke").status_code == 302
    refused = mcp_post(mcp_url, fresh)
    assert refused.status_code == 401
    assert "resource_metadata=" in refused.headers["www-authenticate"]
    assert len(sandbox.operations(type="ticket.create")) == 1


def mcp_post(mcp_url: str, token: str, **headers: str) -> httpx.Response:
    """An MCP initialize request with ``token``."""
    return httpx.post(
        mcp_url,
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "probe", "version": "1"},
            },
        },
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
        trust_env=False,
    )


# --- the same endpoints, driven one step at a time ------------------------------------------


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode()).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def register(client: Client) -> str:
    answer = client.post(
        "/oauth/register/",
        {
            "client_name": "Test connector",
            "redirect_uris": [CALLBACK],
            "grant_types": ["authorization_code", "refresh_token"],
            "token_endpoint_auth_method": "none",
        },
        content_type="application/json",
    )
    assert answer.status_code == 201, answer.content
    return answer.json()["client_id"]


def authorize_query(client_id: str, resource: str, challenge: str | None, **extra) -> str:
    params = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": CALLBACK,
        "state": "s1",
        "resource": resource,
        **extra,
    }
    if challenge:
        params |= {"code_challenge": challenge, "code_challenge_method": "S256"}
    return "/oauth/authorize/?" + urlencode(params)


def tokens_for(admin: Principal, bot: Principal, resource: str) -> dict:
    """Register, approve (as the admin, in the console) and exchange the code."""
    browser = Client()
    browser.force_login(admin.user)
    client_id = register(browser)
    verifier, challenge = pkce()
    page = browser.get(authorize_query(client_id, resource, challenge))
    assert page.status_code == 200, page.content
    form = Form()
    form.feed(page.text)
    answer = browser.post(
        authorize_query(client_id, resource, challenge),
        {**form.fields, "allow": "on", "principal": str(bot.pk), "grant_effect_types": GRANT},
    )
    assert answer.status_code == 302, answer.content
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    exchanged = Client(enforce_csrf_checks=True).post(
        "/oauth/token/",
        {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": CALLBACK,
            "client_id": client_id,
            "code_verifier": verifier,
            "resource": resource,
        },
    )
    assert exchanged.status_code == 200, exchanged.content
    return exchanged.json() | {"client_id": client_id}


def test_the_endpoint_is_a_protected_resource_with_its_metadata(mcp_url, gateway_url):
    no_token = httpx.post(mcp_url, json={}, trust_env=False)
    assert no_token.status_code == 401
    port = urlsplit(mcp_url).port
    expected = f'Bearer resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp"'
    assert no_token.headers["www-authenticate"] == expected
    for path in (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ):
        metadata = httpx.get(f"http://127.0.0.1:{port}{path}", trust_env=False).json()
        assert metadata["resource"] == mcp_url
        assert metadata["authorization_servers"] == [gateway_url]
    server = httpx.get(f"{gateway_url}/.well-known/oauth-authorization-server", trust_env=False)
    document = server.json()
    assert document["issuer"] == gateway_url
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["registration_endpoint"] == f"{gateway_url}/oauth/register/"
    assert document["revocation_endpoint"] == f"{gateway_url}/oauth/revoke/"
    assert set(document["grant_types_supported"]) == {"authorization_code", "refresh_token"}
    assert "none" in document["token_endpoint_auth_methods_supported"]


def test_an_authorization_request_without_pkce_is_refused(admin_person, bot, settings):
    resource = "http://127.0.0.1:9/mcp"
    settings.GATEWAY_OAUTH_RESOURCES = [resource]
    browser = Client()
    browser.force_login(admin_person.user)
    client_id = register(browser)
    for query in (
        authorize_query(client_id, resource, None),
        authorize_query(client_id, resource, None, code_challenge="x" * 43),  # plain
        authorize_query(
            client_id, resource, None, code_challenge="x" * 43, code_challenge_method="plain"
        ),
    ):
        answer = browser.get(query)
        assert answer.status_code == 302, answer.content
        params = parse_qs(urlsplit(answer["Location"]).query)
        assert params["error"] == ["invalid_request"], params
        assert "code" not in params
    assert not OAuthConnection.objects.exists()


def test_an_authorization_request_for_an_unknown_endpoint_is_refused(admin_person, settings):
    settings.GATEWAY_OAUTH_RESOURCES = ["http://127.0.0.1:9/mcp"]
    browser = Client()
    browser.force_login(admin_person.user)
    client_id = register(browser)
    _, challenge = pkce()
    for resource in ("http://evil.example/mcp", ""):
        answer = browser.get(authorize_query(client_id, resource, challenge))
        assert answer.status_code == 400
        assert "Unknown MCP endpoint" in answer.text


def test_only_an_admin_approves(admin_person, bot, settings):
    from tests.conftest import issue_token

    issue_token("acme", "oscar", "operator", password=PASSWORD)
    settings.GATEWAY_OAUTH_RESOURCES = ["http://127.0.0.1:9/mcp"]
    operator = Client()
    operator.force_login(get_user_model().objects.get(username="oscar@acme"))
    client_id = register(operator)
    _, challenge = pkce()
    answer = operator.get(authorize_query(client_id, "http://127.0.0.1:9/mcp", challenge))
    assert answer.status_code == 403


def test_a_token_for_another_audience_is_refused(mcp_url, gateway_url, admin_person, bot):
    other = tokens_for(admin_person, bot, "http://127.0.0.1:9/other/mcp")["access_token"]
    refused = mcp_post(mcp_url, other)
    assert refused.status_code == 401
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert "resource_metadata=" in refused.headers["www-authenticate"]
    # Nor does the gateway's API take it directly, whatever endpoint the caller names.
    api = f"{gateway_url}/api/v1/effect-types"
    bearer = {"Authorization": f"Bearer {other}"}
    assert httpx.get(api, headers=bearer, trust_env=False).status_code == 401
    named = {**bearer, "X-Gateway-Resource": mcp_url}
    assert httpx.get(api, headers=named, trust_env=False).status_code == 401
    # The token for this endpoint passes.
    own = tokens_for(admin_person, bot, mcp_url)["access_token"]
    assert mcp_post(mcp_url, own).status_code == 200


def test_a_token_revoked_by_its_client_is_refused_at_once(mcp_url, admin_person, bot):
    tokens = tokens_for(admin_person, bot, mcp_url)
    assert mcp_post(mcp_url, tokens["access_token"]).status_code == 200
    revoked = Client(enforce_csrf_checks=True).post(
        "/oauth/revoke/",
        {"token": tokens["access_token"], "client_id": tokens["client_id"]},
    )
    assert revoked.status_code == 200
    assert mcp_post(mcp_url, tokens["access_token"]).status_code == 401


def test_origin_and_host_are_still_checked_with_an_oauth_token(mcp_url, admin_person, bot):
    token = tokens_for(admin_person, bot, mcp_url)["access_token"]
    port = urlsplit(mcp_url).port
    assert mcp_post(mcp_url, token, Origin="http://evil.example").status_code == 403
    assert mcp_post(mcp_url, token, Host=f"evil.example:{port}").status_code == 421
    assert mcp_post(mcp_url, token, Origin=f"http://127.0.0.1:{port}").status_code == 200


def consent_form(admin_person: Principal, settings) -> tuple[Client, str, Form]:
    """A client registered for a resource the gateway knows, and the admin's authorize page
    for it: the signed-in browser, the authorize URL and the page's form."""
    resource = "http://127.0.0.1:9/mcp"
    settings.GATEWAY_OAUTH_RESOURCES = [resource]
    browser = Client()
    browser.force_login(admin_person.user)
    _, challenge = pkce()
    query = authorize_query(register(browser), resource, challenge)
    form = Form()
    form.feed(browser.get(query).text)
    return browser, query, form


def test_a_code_exchanged_without_its_verifier_is_refused(admin_person, bot, settings):
    browser, query, form = consent_form(admin_person, settings)
    answer = browser.post(query, {**form.fields, "allow": "on", "principal": str(bot.pk)})
    code = parse_qs(urlsplit(answer["Location"]).query)["code"][0]
    for verifier in ({}, {"code_verifier": secrets.token_urlsafe(48)}):
        exchanged = Client(enforce_csrf_checks=True).post(
            "/oauth/token/",
            {
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": CALLBACK,
                "client_id": parse_qs(urlsplit(query).query)["client_id"][0],
                **verifier,
            },
        )
        assert exchanged.status_code in (400, 401), exchanged.content
        assert "access_token" not in exchanged.json()


def test_a_denied_client_gets_no_code(admin_person, bot, settings):
    browser, query, form = consent_form(admin_person, settings)
    answer = browser.post(query, form.fields)
    params = parse_qs(urlsplit(answer["Location"]).query)
    assert params["error"] == ["access_denied"] and "code" not in params
    assert not OAuthConnection.objects.exists()


def test_a_refresh_token_is_used_once(admin_person, bot, settings):
    resource = "http://127.0.0.1:9/mcp"
    settings.GATEWAY_OAUTH_RESOURCES = [resource]
    tokens = tokens_for(admin_person, bot, resource)

    def refresh(refresh_token: str):
        return Client(enforce_csrf_checks=True).post(
            "/oauth/token/",
            {
                "grant_type": "refresh_token",
                "refresh_token": refresh_token,
                "client_id": tokens["client_id"],
            },
        )

    first = refresh(tokens["refresh_token"])
    assert first.status_code == 200
    assert first.json()["refresh_token"] != tokens["refresh_token"]  # rotated
    assert refresh(tokens["refresh_token"]).status_code in (400, 401)  # reused: refused


def test_only_the_tenants_admins_see_and_disconnect_its_clients(admin_person, bot, settings):
    from tests.conftest import issue_token

    resource = "http://127.0.0.1:9/mcp"
    settings.GATEWAY_OAUTH_RESOURCES = [resource]
    tokens_for(admin_person, bot, resource)
    connection = OAuthConnection.objects.get()
    issue_token("acme", "oscar", "operator", password=PASSWORD)
    issue_token("globex", "root", "admin", password=PASSWORD)
    operator, rival = Client(), Client()
    operator.force_login(get_user_model().objects.get(username="oscar@acme"))
    rival.force_login(get_user_model().objects.get(username="root@globex"))
    assert operator.get("/mcp-clients").status_code == 403
    assert operator.post(f"/mcp-clients/{connection.pk}/revoke").status_code == 403
    listing = rival.get("/mcp-clients")
    assert listing.status_code == 200 and "Test connector" not in listing.text
    assert rival.post(f"/mcp-clients/{connection.pk}/revoke").status_code == 404
    connection.refresh_from_db()
    assert connection.revoked_at is None
