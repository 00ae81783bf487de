"""WSGI entry point for gunicorn or any WSGI server."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
application = get_wsgi_application()

# The URLconf, and with it every view module, loaded now, while the server starts this
# process, instead of by the first request it serves, which waited for the imports: a first
# GET of an effect took 136 ms without this and 26 ms with it (its connection to PostgreSQL
# and the token's first read), the next ones 6 ms.
from django.urls import reverse  # noqa: E402 (Django is set up above)

reverse("api-root")

# What is loaded now lives as long as the process: out of the collector's full passes, which
# stopped every request of the process for as long as they walked it (gateway.lib.gcfreeze).
from gateway.lib.gcfreeze import freeze_startup_objects  # noqa: E402

freeze_startup_objects()
