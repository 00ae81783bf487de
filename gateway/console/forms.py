"""The console's forms: what each action takes, validated before any service is called."""

from __future__ import annotations

from django import forms


def normalise_digest(value: str) -> str:
    """What an approver pastes: surrounding blanks and a missing ``sha256:`` are forgiven;
    the hex itself must be the command's, character for character."""
    value = "".join(value.split()).lower()
    if value and not value.startswith("sha256:"):
        value = "sha256:" + value
    return value


class ApproveForm(forms.Form):
    payload_digest = forms.CharField(
        label="Digest you read",
        max_length=100,
        help_text="Type or paste the payload digest shown above; it must be the command's.",
    )
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea)
    # The passkey's assertion over the approval challenge (static/passkeys.js fills them in;
    # gateway.signing verifies them), base64url each.
    signature = forms.CharField(max_length=2000, required=False)
    signature_nonce = forms.CharField(max_length=64, required=False)
    signature_key_id = forms.CharField(max_length=1400, required=False)
    signature_authenticator_data = forms.CharField(max_length=4000, required=False)
    signature_client_data_json = forms.CharField(max_length=8000, required=False)
    signature_user_handle = forms.CharField(max_length=200, required=False)

    def clean_payload_digest(self) -> str:
        return normalise_digest(self.cleaned_data["payload_digest"])


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=2000, required=False)


class RequiredReasonForm(forms.Form):
    reason = forms.CharField(max_length=2000)


class NoteForm(forms.Form):
    note = forms.CharField(max_length=2000, required=False)


# What "expires in" offers when granting (seconds; None: the grant does not expire).
GRANT_EXPIRIES = [
    ("", "never"),
    ("3600", "in 1 hour"),
    ("28800", "in 8 hours"),
    ("86400", "in 1 day"),
    ("604800", "in 7 days"),
    ("2592000", "in 30 days"),
    ("7776000", "in 90 days"),
]


class GrantForm(forms.Form):
    """What ``POST /api/v1/capabilities`` takes (CapabilityGrantSerializer), as a form."""

    principal = forms.CharField(max_length=150)
    effect_types = forms.CharField(
        max_length=2000,
        help_text="Types or patterns, separated by spaces or commas: ticket.create billing.*",
    )
    resource_selector = forms.CharField(max_length=200, required=False)
    budget_count = forms.IntegerField(min_value=1, required=False)
    budget_amount = forms.IntegerField(min_value=1, required=False)
    budget_currency = forms.CharField(max_length=3, required=False)
    expires_in = forms.TypedChoiceField(
        choices=GRANT_EXPIRIES, coerce=int, empty_value=None, required=False
    )

    def clean_effect_types(self) -> list[str]:
        patterns = [p for p in self.cleaned_data["effect_types"].replace(",", " ").split() if p]
        if not patterns:
            raise forms.ValidationError("Name at least one effect type (patterns allowed).")
        if any(len(p) > 100 for p in patterns):
            raise forms.ValidationError("A type or pattern is at most 100 characters.")
        return patterns

    def clean_budget_currency(self) -> str:
        currency = self.cleaned_data["budget_currency"].strip().upper()
        if currency and not (len(currency) == 3 and currency.isalpha() and currency.isascii()):
            raise forms.ValidationError("An ISO 4217 code: three letters, like EUR.")
        return currency
