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
