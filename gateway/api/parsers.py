"""The API's one body parser: gateway.lib.jsonin's strict reader behind DRF's interface."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import parsers
from rest_framework.exceptions import ParseError, UnsupportedMediaType

from gateway.lib import jsonin

UTF8_NAMES = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


class StrictJSONParser(parsers.BaseParser):
    """JSON as gateway.lib.jsonin reads it; any other charset than UTF-8 is a 415."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):
        charset = charset_of(media_type or "")
        if charset and charset not in UTF8_NAMES:
            raise UnsupportedMediaType(
                media_type, detail=f"charset={charset} is not supported: send UTF-8 JSON."
            )
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1 if limit else -1) if stream is not None else b""
        if limit and len(raw) > limit:
            raise RequestDataTooBig(f"The request body is larger than {limit} bytes.")
        try:
            return jsonin.loads(raw)
        except jsonin.JsonInputError as exc:
            raise ParseError(f"{exc} (at {exc.where})") from None


def charset_of(content_type: str) -> str:
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return ""
