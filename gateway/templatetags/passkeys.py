"""``{% load passkeys %}``: whether approving an effect is signed with a passkey."""

from __future__ import annotations

from django import template

from gateway import signing
from gateway.models import Effect

register = template.Library()


@register.filter
def passkey_required(effect: Effect) -> bool:
    """``effect|passkey_required``: its approval must be signed (gateway.signing's policy)."""
    return signing.effect_needs_signature(effect)
