"""``manage.py revoke_token PREFIX [--tenant SLUG] [--reason TEXT]``: stop a token now."""

from django.core.management.base import BaseCommand, CommandError

from gateway import tokens
from gateway.errors import GatewayError


class Command(BaseCommand):
    help = "Revoke an API token by the prefix shown when it was issued (egw_xxxxxxxx)."

    def add_arguments(self, parser):
        parser.add_argument("prefix")
        parser.add_argument("--tenant", help="tenant slug, when the prefix is ambiguous")
        parser.add_argument("--reason", default="")

    def handle(self, *args, prefix: str, tenant: str | None, reason: str, **options):
        try:
            token = tokens.token_find(prefix=prefix, tenant_slug=tenant)
            tokens.token_revoke(token=token, actor=None, reason=reason)
        except GatewayError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"Revoked {token.prefix}… of {token.principal}.")
