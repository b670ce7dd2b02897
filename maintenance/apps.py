from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, pre_delete, pre_migrate


class MaintenanceConfig(AppConfig):
    name = "maintenance"
    verbose_name = "Maintenance"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only connects: no database work at import or here (the tables may not exist yet).
        from maintenance import contradictions, rank_triggers
        from maintenance.signals import forget_rank_marks, lock_rank_state, sync_schedules_after_migrate
        from memory import writes
        from memory.models import Workspace

        # A rule written through any door is checked for contradictions before it returns.
        writes.install_write_check(contradictions)

        post_migrate.connect(
            sync_schedules_after_migrate, sender=self, dispatch_uid="maintenance.sync_schedules"
        )
        # SQLite checks every trigger when a migration renames the rebuilt copy of a table, and
        # the rank's read memory_entry: they are dropped before migrations run, and come back.
        pre_migrate.connect(
            rank_triggers.drop_before_migrate, sender=self, dispatch_uid="maintenance.rank_drop"
        )
        post_migrate.connect(
            rank_triggers.ensure_after_migrate, sender=self, dispatch_uid="maintenance.rank_triggers"
        )
        # The triggers mark every entry a workspace's deletion removes; nothing folds them then.
        post_delete.connect(forget_rank_marks, sender=Workspace, dispatch_uid="maintenance.forget_rank_marks")
        pre_delete.connect(lock_rank_state, sender=Workspace, dispatch_uid="maintenance.lock_rank_state")
