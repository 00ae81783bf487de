"""``manage.py rotate_token PREFIX [--tenant SLUG] [--expires-in SECONDS]``: replace a token;
the old one stops at once and the new one is printed alone on the last line."""

from django.core.management.base import BaseCommand, CommandError

from gateway import tokens
from gateway.errors import GatewayError


class Command(BaseCommand):
    help = "Rotate an API token: revoke it and print a new one for the same principal."

    def add_arguments(self, parser):
        parser.add_argument("prefix")
        parser.add_argument("--tenant", help="tenant slug, when the prefix is ambiguous")
        parser.add_argument("--expires-in", type=int, help="seconds the new token lives")

    def handle(self, *args, prefix: str, tenant: str | None, expires_in: int | None, **options):
        try:
            old = tokens.token_find(prefix=prefix, tenant_slug=tenant)
            new, clear = tokens.token_rotate(token=old, actor=None, expires_in=expires_in)
        except GatewayError as exc:
            raise CommandError(exc.detail) from None
        expiry = new.expires_at.isoformat() if new.expires_at else "never"
        self.stdout.write(f"Rotated {old.prefix}… of {old.principal}; expires {expiry}.")
        self.stdout.write(clear)
