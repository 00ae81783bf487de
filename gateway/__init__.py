"""The Effect Gateway: Django project and the effect ledger app."""

from gateway.celery import app as celery_app

__all__ = ["celery_app"]
