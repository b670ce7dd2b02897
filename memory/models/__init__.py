"""The Django models of the memory app, defined in this package's modules and imported here so
that Django registers them and ``from memory.models import Entry`` names every model; the
vocabularies and query helpers are imported from their own modules (``memory.models.choices``,
``memory.models.entries``)."""

from memory.models.entries import Entry, EntryScore
from memory.models.records import (
    CodeAnchor,
    EntryAccess,
    IdempotencyKey,
    LifecycleEvent,
    LiveMessage,
    Relationship,
    Tombstone,
)
from memory.models.workspaces import ApiKey, Membership, Tag, Workspace

# Defined in its own module (it needs the workspace above); imported here so that Django
# registers it with the app's other models.
from memory.policy_model import MaintenancePolicy

__all__ = [
    "ApiKey",
    "CodeAnchor",
    "Entry",
    "EntryAccess",
    "EntryScore",
    "IdempotencyKey",
    "LifecycleEvent",
    "LiveMessage",
    "MaintenancePolicy",
    "Membership",
    "Relationship",
    "Tag",
    "Tombstone",
    "Workspace",
]
