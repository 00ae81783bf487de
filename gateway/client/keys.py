"""Moved to ``effect_gateway_client.keys`` (clients/python, installable without Django); this
import path stays public and names the very same module."""

import sys

from effect_gateway_client import keys as _module

sys.modules[__name__] = _module
