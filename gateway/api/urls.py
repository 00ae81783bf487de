from django.urls import include, path, re_path
from rest_framework.routers import SimpleRouter

from gateway.api import views
from gateway.api.audit import (
    AuditCheckpointsView,
    AuditConsistencyView,
    AuditCosignaturesView,
    AuditInclusionView,
    AuditTreeHeadView,
)
from gateway.api.provider_credentials import (
    ProviderCredentialRetireView,
    ProviderCredentialRotateView,
    ProviderCredentialsView,
)
from gateway.api.signing_keys import SigningKeyViewSet
from gateway.api.tokens import TokenViewSet

router = SimpleRouter(trailing_slash=False)
router.register("effects", views.EffectViewSet, basename="effect")
router.register("capabilities", views.CapabilityViewSet, basename="capability")
router.register("tokens", TokenViewSet, basename="token")
router.register("signing-keys", SigningKeyViewSet, basename="signing-key")

urlpatterns = [
    path("commands", views.CommandSubmitView.as_view(), name="command-submit"),
    path("effect-types", views.EffectTypesView.as_view(), name="effect-types"),
    path("audit/checkpoints", AuditCheckpointsView.as_view(), name="audit-checkpoints"),
    path("audit/tree-head", AuditTreeHeadView.as_view(), name="audit-tree-head"),
    path("audit/proof/inclusion", AuditInclusionView.as_view(), name="audit-proof-inclusion"),
    path("audit/proof/consistency", AuditConsistencyView.as_view(), name="audit-proof-consistency"),
    path("audit/cosignatures", AuditCosignaturesView.as_view(), name="audit-cosignatures"),
    re_path(
        r"^effect-types/(?P<effect_type>[a-z0-9_.]+)/(?P<verb>freeze|unfreeze)$",
        views.EffectTypeFreezeView.as_view(),
        name="effect-type-freeze",
    ),
    re_path(
        r"^principals/(?P<name>[^/]+)/(?P<verb>freeze|unfreeze)$",
        views.PrincipalFreezeView.as_view(),
        name="principal-freeze",
    ),
    re_path(
        r"^providers/(?P<name>[A-Za-z0-9_.-]+)/credentials$",
        ProviderCredentialsView.as_view(),
        name="provider-credentials",
    ),
    re_path(
        r"^providers/(?P<name>[A-Za-z0-9_.-]+)/credentials/rotate$",
        ProviderCredentialRotateView.as_view(),
        name="provider-credential-rotate",
    ),
    re_path(
        r"^providers/(?P<name>[A-Za-z0-9_.-]+)/credentials/(?P<credential_id>[0-9]{1,18})/retire$",
        ProviderCredentialRetireView.as_view(),
        name="provider-credential-retire",
    ),
    *router.urls,
    path("", include("reconciliation.api.urls")),
    path("", include("sagas.api.urls")),
]
