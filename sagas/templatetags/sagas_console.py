"""Template tags of the saga pages: a run's state as a badge."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from sagas.choices import STATE_TONE, SagaState

register = template.Library()


@register.simple_tag
def saga_badge(state: str) -> str:
    """A saga run's state with its tone from ``sagas.choices.STATE_TONE``."""
    tone = STATE_TONE.get(state, "neutral")
    label = SagaState(state).label if state in SagaState.values else state
    return format_html('<span class="badge tone-{}" data-state="{}">{}</span>', tone, state, label)
