"""``manage.py issue_token --tenant SLUG --principal NAME --role ROLE [--password PW]``

Creates the tenant and the principal when missing and prints a new API token alone on the
last line. With ``--password`` the principal can also log in to the console as
``NAME@SLUG``.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from gateway.api.auth import token_create
from gateway.choices import Role
from gateway.models import Principal, Tenant


class Command(BaseCommand):
    help = "Create a tenant and principal if needed and print a new API token (last line)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug, e.g. acme")
        parser.add_argument("--principal", required=True, help="principal name, e.g. refund-bot")
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--password", help="also allow console login with this password")

    @transaction.atomic
    def handle(
        self, *args, tenant: str, principal: str, role: str, password: str | None, **options
    ):
        tenant_obj, tenant_created = Tenant.objects.get_or_create(
            slug=tenant, defaults={"name": tenant}
        )
        principal_obj, created = Principal.objects.get_or_create(
            tenant=tenant_obj, name=principal, defaults={"role": role}
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
        if password:
            self.stdout.write(f"Console login: {principal}@{tenant}")
        self.stdout.write(token_create(principal=principal_obj))
