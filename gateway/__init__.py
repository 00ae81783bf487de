"""The Effect Gateway: Django project and the effect ledger app.

Deliberately empty: ``gateway.client`` must import without Django or Celery. The Celery app
is bound in ``GatewayConfig.ready()``; ``celery -A gateway`` finds ``gateway.celery`` itself.
"""
