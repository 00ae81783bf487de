"""The audit witness (``manage.py audit_witness``): a process apart from the gateway, with its
own Ed25519 key and its own directory (never the gateway's database), that fetches the
tenant's latest signed tree head over HTTP, checks its signature and that it extends the last
head the witness cosigned (a consistency proof from the same API), then cosigns it and can
post the cosignature back. A head that does not extend the last cosigned one is a rewritten
log: the witness stops with both sizes and roots and cosigns nothing.

The directory holds ``witness.key`` (the seed, base64, 0600), ``gateway.pub`` (the gateway's
key, pinned on first use unless given) and ``cosigned.jsonl`` (every head cosigned, with its
cosignature, appended).
"""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.lib import treehead
from gateway.lib.secretfile import read_or_create

TIMEOUT = 30


class Unreachable(Exception):
    """The gateway did not answer, or not with JSON."""


def call(
    base_url: str, path: str, token: str, *, params: dict[str, Any] | None = None, body=None
) -> Any:
    """GET (or POST ``body``) ``/api/v1/audit/<path>`` with the bearer ``token``; the JSON."""
    url = base_url.rstrip("/") + "/api/v1/audit/" + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode(errors="replace")
        raise Unreachable(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Unreachable(f"{url}: {exc}") from None


def witness_key(directory: Path) -> Ed25519PrivateKey:
    """The witness's own key, generated into ``directory`` on first use."""
    seed = read_or_create(
        directory / "witness.key", lambda: base64.b64encode(os.urandom(32)).decode()
    )
    return Ed25519PrivateKey.from_private_bytes(base64.b64decode(seed))


def last_cosigned(directory: Path) -> dict[str, Any] | None:
    path = directory / "cosigned.jsonl"
    if not path.exists():
        return None
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def _gateway_key(directory: Path, given: str | None, head: dict[str, Any]) -> str:
    pinned = directory / "gateway.pub"
    if given:
        return given
    if pinned.exists():
        return pinned.read_text().strip()
    key = str(head.get("key", ""))
    pinned.write_text(key + "\n")
    return key


@dataclass
class Round:
    head: dict[str, Any]
    cosignature: dict[str, Any] | None
    message: str


def witness_once(
    base_url: str, token: str, directory: Path, *, gateway_key: str | None = None
) -> Round:
    """One round: fetch, check, cosign. Raises treehead.Invalid (the alarm) when the head is
    not signed by the gateway's key or does not extend the last cosigned head."""
    directory.mkdir(parents=True, exist_ok=True)
    key = witness_key(directory)
    head = call(base_url, "tree-head", token)
    head = {field: head.get(field) for field in (*treehead.FIELDS, "signature")}
    trusted = _gateway_key(directory, gateway_key, head)
    size, root = treehead.check_head(head, trusted)
    last = last_cosigned(directory)
    if last is not None:
        before = last["head"]
        if before.get("tenant_id") != head.get("tenant_id"):
            raise treehead.Invalid("the gateway answered with another tenant's head")
        if before["tree_size"] > size:
            raise treehead.Invalid(
                f"the log was rewritten: its tree has {size} leaves (root {root.hex()}), "
                f"the witness cosigned {before['tree_size']} (root {before['root_hash']})"
            )
        if (before["tree_size"], before["root_hash"]) == (size, root.hex()):
            return Round(head, None, f"tree of size {size} already cosigned")
        proof = call(
            base_url,
            "proof/consistency",
            token,
            params={"first": before["tree_size"], "second": size},
        )
        treehead.check_consistency(before, head, proof, trusted)
    cosignature = treehead.cosign(head, key)
    with (directory / "cosigned.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps({"head": head, "cosignature": cosignature}, sort_keys=True) + "\n")
    return Round(head, cosignature, f"cosigned the tree of size {size} (root {root.hex()})")
