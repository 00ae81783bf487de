"""ASGI entry point."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
application = get_asgi_application()

# As gateway.wsgi does: what is loaded now lives as long as the process, out of the
# collector's full passes (gateway.lib.gcfreeze).
from gateway.lib.gcfreeze import freeze_startup_objects  # noqa: E402 (Django is set up above)

freeze_startup_objects()
