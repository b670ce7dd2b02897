"""Console settings page: the maintenance policy and the API keys of a workspace.

Every member sees the page (policy values and the key list, read-only); only admins get the
forms, and the two POST endpoints check the admin role in the view (``workspace_page("admin")``)
before anything runs, so a hand-made POST by a viewer or operator is a 403 that changes nothing.

- The policy form is a ModelForm over MaintenancePolicy. It is bound to the row locked with
  ``select_for_update`` and only the settings this admin changed on the page are written (the
  form carries the values it showed), like the API's ``policy_put``: two admins changing
  different settings at once both win. Out-of-range numbers
  are clamped by the model's ``save``; invalid input (a non-number, a residue pattern that does
  not compile) re-renders the page with the errors and status 422.
- A new key's raw secret appears once, on the response to its creation (never stored, never
  redirected to, never shown again); the list shows keys by prefix. Revoking another
  workspace's key id is "not found" (404) and touches nothing.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_POST

from console.access import Console, workspace_page
from console.settings_help import GROUPS, HELP, range_text, unit
from memory import accounts
from memory.errors import NotFound, ServiceError
from memory.models import ApiKey
from memory.models.choices import ID_MAX, KeyRole, Role
from memory.policy import APPLY, LIMITS, PROPOSE, clean_tags
from memory.policy_model import POLICY_FIELDS, MaintenancePolicy

REVIEW_MODE_CHOICES = [
    (PROPOSE, "Propose: archives and tombstones wait for an operator's approval"),
    (APPLY, "Apply: maintenance archives and tombstones at once (each change revertible)"),
]
TEMPLATE = "console/settings.html"


class PolicyForm(forms.ModelForm):
    """Who has the last word (review_mode), all the LIMITS settings, exclude_tags as
    comma-separated text and residue_patterns one regular expression per line. The model's
    ``clean`` validates the patterns."""

    review_mode = forms.ChoiceField(
        choices=REVIEW_MODE_CHOICES,
        widget=forms.RadioSelect,
        required=False,  # a page without the control (loaded before it existed) keeps the mode
        help_text=HELP["review_mode"],
    )

    exclude_tags = forms.CharField(
        required=False,
        help_text=HELP["exclude_tags"],
        widget=forms.TextInput(attrs={"size": 60}),
    )
    residue_patterns = forms.CharField(
        required=False,
        help_text=HELP["residue_patterns"],
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60}),
    )

    class Meta:
        model = MaintenancePolicy
        fields = POLICY_FIELDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in LIMITS:
            self.fields[name].help_text = HELP[name]
        # The page carries the values it showed (``initial-<name>``), so ``changed_data`` is
        # what this admin edited, not what differs from a row another admin changed since.
        for field in self.fields.values():
            field.show_hidden_initial = True
        self.initial["exclude_tags"] = ", ".join(self.instance.exclude_tags or [])
        self.initial["residue_patterns"] = "\n".join(self.instance.residue_patterns or [])

    def clean_review_mode(self) -> str:
        return self.cleaned_data.get("review_mode") or self.instance.review_mode

    def clean_exclude_tags(self) -> list[str]:
        return clean_tags(self.cleaned_data.get("exclude_tags") or "")

    def clean_residue_patterns(self) -> list[str]:
        text = self.cleaned_data.get("residue_patterns") or ""
        return [line.strip() for line in text.splitlines() if line.strip()]


class KeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Who or what uses the key (e.g. the agent's name).")
    role = forms.ChoiceField(choices=KeyRole.choices, initial=KeyRole.AGENT)


# --- helpers ------------------------------------------------------------------------------


def _settings_url(console: Console) -> str:
    return reverse("console:settings", kwargs={"slug": console.workspace.slug})


def _see_other(url: str) -> HttpResponse:
    response = HttpResponseRedirect(url)
    response.status_code = 303  # after a POST, GET the page (the browser never re-posts)
    return response


def _groups(form: PolicyForm, policy: MaintenancePolicy) -> list[dict[str, Any]]:
    """The settings by purpose (``console.settings_help``), each with its form field (for
    an admin), its stored value, unit, range and the sentence on what it does."""
    return [
        {
            "key": group.key,
            "title": group.title,
            "intro": group.intro,
            "settings": [
                {
                    "name": name,
                    "label": form[name].label,
                    "field": form[name],
                    "value": getattr(policy, name),
                    "unit": unit(name),
                    "range": range_text(name) if name in LIMITS else "",
                    "help": HELP[name],
                }
                for name in group.names
            ],
        }
        for group in GROUPS
    ]


def _keys(console: Console) -> list[ApiKey]:
    return list(ApiKey.objects.filter(workspace=console.workspace).order_by("-created_at", "-pk"))


def _render(
    request: HttpRequest,
    console: Console,
    *,
    policy_form: PolicyForm | None = None,
    key_form: KeyCreateForm | None = None,
    new_key: tuple[ApiKey, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    policy = policy_form.instance if policy_form is not None else MaintenancePolicy.read(console.workspace)
    if policy_form is None:
        policy_form = PolicyForm(instance=policy)
    context = {
        "console": console,
        "policy": policy,
        "groups": _groups(policy_form, policy),
        "policy_form": policy_form if console.is_admin else None,
        "key_form": (key_form or KeyCreateForm()) if console.is_admin else None,
        "keys": _keys(console),
        "new_key": new_key,
    }
    response = render(request, TEMPLATE, context, status=status)
    if new_key is not None:
        add_never_cache_headers(response)  # the raw key must not linger in any cache
    return response


# --- views --------------------------------------------------------------------------------


@workspace_page()
def settings_page(request: HttpRequest, console: Console) -> HttpResponse:
    """The policy and the keys; the forms only for admins."""
    return _render(request, console)


@workspace_page(Role.ADMIN)
@require_POST
def settings_policy(request: HttpRequest, console: Console) -> HttpResponse:
    """Change the policy: only the settings that changed are written, clamped into range."""
    changed: list[str] = []
    form = PolicyForm(request.POST, instance=MaintenancePolicy.read(console.workspace))
    if form.is_valid():
        changed = [name for name in POLICY_FIELDS if name in form.changed_data]
        # The form has validated and set them on its instance (the model's clean checks patterns).
        MaintenancePolicy.write(console.workspace, {name: getattr(form.instance, name) for name in changed})
    else:
        messages.error(request, "The policy was not saved: correct the errors below.")
        return _render(request, console, policy_form=form, status=422)
    if changed:
        messages.success(request, f"Policy saved ({', '.join(changed)}).")
    else:
        messages.info(request, "No policy setting changed.")
    return _see_other(_settings_url(console))


@workspace_page(Role.ADMIN)
@require_POST
def settings_keys(request: HttpRequest, console: Console) -> HttpResponse:
    """``action=create`` (``name``, ``role``): a new key, its secret shown on this response
    only. ``action=revoke`` (``key_id``): revoke one of this workspace's keys."""
    action = request.POST.get("action", "")
    if action == "create":
        form = KeyCreateForm(request.POST)
        if not form.is_valid():
            return _render(request, console, key_form=form, status=422)
        try:
            key, raw = accounts.api_key_create(
                workspace=console.workspace,
                name=form.cleaned_data["name"],
                role=form.cleaned_data["role"],
                actor=console.actor,
            )
        except ServiceError as exc:
            form.add_error(None, exc.detail)
            return _render(request, console, key_form=form, status=422)
        return _render(request, console, new_key=(key, raw))
    if action == "revoke":
        raw_id = request.POST.get("key_id", "")
        if not raw_id.isdigit() or int(raw_id) > ID_MAX:
            raise Http404("no such key")
        try:
            key = accounts.api_key_revoke(workspace=console.workspace, key_id=int(raw_id))
        except NotFound as exc:
            raise Http404(exc.detail) from None
        messages.success(request, f"Key {key.prefix}… ({key.name}) is revoked.")
        return _see_other(_settings_url(console))
    messages.error(request, "Unknown key action.")
    return _see_other(_settings_url(console))
