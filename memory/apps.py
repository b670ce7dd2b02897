from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_search_index(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    # SQLite rebuilds memory_entry for many schema changes, dropping the FTS triggers with it.
    from django.db import connections

    from memory.search_index import ensure_sqlite_index

    ensure_sqlite_index(connections[using])


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models import ForeignObject, IntegerField

        from memory.rawsql import AnyOf

        # Integer columns only (ids, their foreign keys): the lookup sends a bigint array.
        IntegerField.register_lookup(AnyOf)  # AutoField, BigAutoField, BigIntegerField too
        ForeignObject.register_lookup(AnyOf)  # relations keep lookups of their own
        post_migrate.connect(_ensure_search_index, sender=self, dispatch_uid="memory.search_index")
