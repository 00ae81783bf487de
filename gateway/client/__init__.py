"""The gateway's Python client, re-exported from ``effect_gateway_client``.

The real home is the standalone package in ``clients/python`` (``pip install
effect-gateway-client``: httpx only, no Django), so that agent code installs it beside any
agent framework. This path stays public for code written against the Django distribution;
``gateway.client.models`` etc. are the same module objects as ``effect_gateway_client.models``.
"""

from effect_gateway_client import *  # noqa: F403
from effect_gateway_client import __all__  # noqa: F401
