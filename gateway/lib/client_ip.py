"""The client's address for login throttling: ``X-Forwarded-For`` is believed only when the
direct peer is one of ``GATEWAY_TRUSTED_PROXIES``.

Anyone can send an ``X-Forwarded-For`` header; only a proxy we run appends a true hop to it.
So the header is read from the right (the hop our proxy saw), skipping our own proxies, and
the first address that is not one of them is the client. From any other peer the header is
ignored and the peer's own address is the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """``["10.0.0.0/8", "192.0.2.7"]`` as networks; a malformed entry is a configuration error."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as error:
            raise ImproperlyConfigured(
                f"GATEWAY_TRUSTED_PROXIES: {cidr!r} is not an address or a CIDR ({error})"
            ) from None
    return tuple(networks)


@lru_cache(maxsize=8)
def _trusted(cidrs: tuple[str, ...]) -> tuple[Network, ...]:
    return parse_networks(cidrs)


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _is_trusted(address: Address | None, trusted: tuple[Network, ...]) -> bool:
    return address is not None and any(address in network for network in trusted)


def client_ip(request: HttpRequest) -> str:
    """The client's address (module doc); django-axes' ``AXES_CLIENT_IP_CALLABLE``."""
    peer = str(request.META.get("REMOTE_ADDR") or "")
    trusted = _trusted(tuple(settings.GATEWAY_TRUSTED_PROXIES))
    if not _is_trusted(_address(peer), trusted):
        return peer
    hops = str(request.META.get("HTTP_X_FORWARDED_FOR") or "").split(",")
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:
            # Garbage in the chain: believe nothing to the left of it.
            return peer
        if not _is_trusted(address, trusted):
            return str(address)
    return peer
