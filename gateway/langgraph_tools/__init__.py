"""Moved to ``effect_gateway_client.langgraph`` (the standalone client's ``langgraph`` extra);
this import path stays public and names the very same module."""

import sys

from effect_gateway_client import langgraph as _module

sys.modules[__name__] = _module
