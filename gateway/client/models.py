"""Moved to ``effect_gateway_client.models`` (clients/python, installable without Django); this
import path stays public and names the very same module."""

import sys

from effect_gateway_client import models as _module

sys.modules[__name__] = _module
