"""``manage.py issue_token --tenant SLUG --principal NAME --role ROLE [--password PW]``

Creates the tenant and the principal when missing and prints a new API token alone on the
last line. With ``--password`` the principal can also log in to the console as
``NAME@SLUG``.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from gateway import audit
from gateway.api.auth import token_create
from gateway.capabilities import capability_grant
from gateway.choices import Role
from gateway.models import Principal, Tenant


class Command(BaseCommand):
    help = "Create a tenant and principal if needed and print a new API token (last line)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug, e.g. acme")
        parser.add_argument("--principal", required=True, help="principal name, e.g. refund-bot")
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--password", help="also allow console login with this password")
        grant = parser.add_argument_group(
            "agent capability",
            "An agent acts under a grant. Without these options a new agent gets one for "
            "every effect type and resource, with no budget and no expiry.",
        )
        grant.add_argument("--types", help="comma-separated type patterns, e.g. 'ticket.*'")
        grant.add_argument("--resources", default="*", help="e.g. 'order:ord_*'")
        grant.add_argument("--budget-count", type=int, help="at most this many commands")
        grant.add_argument("--budget-amount", type=int, help="total amount (minor units)")
        grant.add_argument("--currency", default="", help="currency of --budget-amount")
        grant.add_argument(
            "--expires-in",
            type=int,
            help="seconds until the grant and the token expire (token: see --token-expires-in)",
        )
        parser.add_argument(
            "--token-expires-in",
            type=int,
            help="seconds until the token expires; 0: never. Default: agents "
            "GATEWAY_AGENT_TOKEN_TTL, people GATEWAY_PERSON_TOKEN_TTL (both 90 days), or "
            "--expires-in when given",
        )

    @transaction.atomic
    def handle(
        self,
        *args,
        tenant: str,
        principal: str,
        role: str,
        password: str | None,
        types: str | None = None,
        resources: str = "*",
        budget_count: int | None = None,
        budget_amount: int | None = None,
        currency: str = "",
        expires_in: int | None = None,
        token_expires_in: int | None = None,
        **options,
    ):
        tenant_obj, tenant_created = Tenant.objects.get_or_create(
            slug=tenant, defaults={"name": tenant}
        )
        principal_obj, created = Principal.objects.get_or_create(
            tenant=tenant_obj, name=principal, defaults={"role": role}
        )
        if created:  # a principal and its role are control actions of the chain
            audit.record_control(
                tenant_id=tenant_obj.pk,
                kind="principal_created",
                subject=f"principal:{principal}",
                actor="issue_token",
                principal=principal_obj,
                data={"role": role},
            )
        if not created and principal_obj.role != role:
            raise CommandError(
                f"{principal}@{tenant} exists with role {principal_obj.role}; "
                f"roles are not changed by issue_token."
            )
        if password:
            user = principal_obj.user
            if user is None:
                user, _ = get_user_model().objects.get_or_create(username=f"{principal}@{tenant}")
                principal_obj.user = user
                principal_obj.save(update_fields=["user"])
            user.set_password(password)
            user.is_staff = role == Role.ADMIN
            user.save()
        if tenant_created:
            self.stdout.write(f"Created tenant {tenant}.")
        self.stdout.write(
            f"{'Created' if created else 'Found'} principal {principal}@{tenant} ({role})."
        )
        scoped = types or budget_count or budget_amount or expires_in or resources != "*"
        if role == Role.AGENT and (created or scoped):
            capability = capability_grant(
                granted_by="issue_token",
                principal=principal_obj,
                effect_types=[t.strip() for t in (types or "*").split(",") if t.strip()],
                resource_selector=resources,
                budget_count=budget_count,
                budget_amount=budget_amount,
                budget_currency=currency.upper(),
                expires_in=expires_in,
            )
            self.stdout.write(
                f"Granted capability {capability.pk}: types {capability.effect_types}, "
                f"resources {capability.resource_selector}."
            )
        if password:
            self.stdout.write(f"Console login: {principal}@{tenant}")
        if token_expires_in is None:
            token_expires_in = expires_in
        self.stdout.write(token_create(principal=principal_obj, expires_in=token_expires_in))
