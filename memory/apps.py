from django.apps import AppConfig
from django.db.models.signals import post_migrate


class MemoryConfig(AppConfig):
    name = "memory"
    verbose_name = "Memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models import ForeignObject, IntegerField

        from memory.rawsql import AnyOf
        from memory.search_index import ensure_after_migrate

        # Integer columns only (ids, their foreign keys): the lookup sends a bigint array.
        IntegerField.register_lookup(AnyOf)  # AutoField, BigAutoField, BigIntegerField too
        ForeignObject.register_lookup(AnyOf)  # relations keep lookups of their own
        post_migrate.connect(ensure_after_migrate, sender=self, dispatch_uid="memory.search_index")
