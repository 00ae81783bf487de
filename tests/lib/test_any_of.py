"""gateway.lib.any_of: membership in a list sent as one parameter, the same rows as ``__in``."""

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from gateway.lib.any_of import AnyOf
from gateway.models import Tenant


@pytest.fixture
def tenants(db):
    return [Tenant.objects.create(slug=f"any-of-{i}") for i in range(5)]


def test_same_rows_as_in_with_one_parameter(tenants):
    wanted = [t.slug for t in tenants[1:4]] + ["nobody"]
    with CaptureQueriesContext(connection) as captured:
        found = set(Tenant.objects.filter(AnyOf("slug", wanted)).values_list("pk", flat=True))
    assert found == set(Tenant.objects.filter(slug__in=wanted).values_list("pk", flat=True))
    assert len(found) == 3
    assert "string_to_array" in captured[0]["sql"]


def test_or_ed_with_another_condition(tenants):
    query = Tenant.objects.filter(Q(AnyOf("slug", [tenants[0].slug])) | Q(slug=tenants[4].slug))
    assert {t.pk for t in query} == {tenants[0].pk, tenants[4].pk}


def test_an_empty_list_matches_nothing(tenants):
    assert not Tenant.objects.filter(AnyOf("slug", [])).exists()
    assert Tenant.objects.filter(Q(AnyOf("slug", [])) | Q(slug=tenants[0].slug)).count() == 1


def test_values_with_a_comma_are_refused():
    with pytest.raises(ValueError, match="without commas"):
        AnyOf("slug", ["a,b"])
