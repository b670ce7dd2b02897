from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate


class MaintenanceConfig(AppConfig):
    name = "maintenance"
    verbose_name = "Maintenance"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only connects: no database work at import or here (the tables may not exist yet).
        from maintenance import contradictions, rank_triggers
        from maintenance.signals import forget_rank_marks, sync_schedules_after_migrate
        from memory import writes
        from memory.models import Workspace

        # A rule written through any door is checked for contradictions before it returns.
        writes.install_write_check(contradictions)

        post_migrate.connect(
            sync_schedules_after_migrate, sender=self, dispatch_uid="maintenance.sync_schedules"
        )
        # SQLite drops a table's triggers when a migration rebuilds it: the rank's come back.
        post_migrate.connect(
            rank_triggers.ensure_after_migrate, sender=self, dispatch_uid="maintenance.rank_triggers"
        )
        # The triggers mark every entry a workspace's deletion removes; nothing folds them then.
        post_delete.connect(forget_rank_marks, sender=Workspace, dispatch_uid="maintenance.forget_rank_marks")
