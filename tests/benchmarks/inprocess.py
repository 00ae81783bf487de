"""What the in-process benchmarks (web_cost.py, wait_notice.py) share: Django set up against a
scratch database, an agent's token, and the WSGI environ a server builds for an agent's POST."""

from __future__ import annotations

import io
import os
import sys
from typing import Any


def setup_django(queue: str) -> None:
    """Django with the run's ``DATABASE_URL`` and ``CELERY_BROKER_URL``; submissions announce
    to ``queue``, which nobody drains."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("GATEWAY_TASK_QUEUE", queue)
    import django

    django.setup()


def agent_token(tenant: str, principal: str, **grant: Any) -> str:
    """A new agent of ``tenant`` and its bearer token (``issue_token``)."""
    from django.core.management import call_command

    out = io.StringIO()
    call_command(
        "issue_token", tenant=tenant, principal=principal, role="agent", stdout=out, **grant
    )
    return out.getvalue().strip().splitlines()[-1]


def post_environ(path: str, body: bytes, token: str, key: str) -> dict[str, Any]:
    """``POST path`` with a JSON body, a bearer token and an Idempotency-Key."""
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "HTTP_IDEMPOTENCY_KEY": key,
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }
