from django.apps import AppConfig
from django.db.models.signals import post_migrate


class MaintenanceConfig(AppConfig):
    name = "maintenance"
    verbose_name = "Maintenance"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Only connects: no database work at import or here (the tables may not exist yet).
        from maintenance import contradictions
        from maintenance.signals import sync_schedules_after_migrate
        from memory import writes

        # A rule written through any door is checked for contradictions before it returns.
        writes.install_write_check(contradictions)

        post_migrate.connect(
            sync_schedules_after_migrate, sender=self, dispatch_uid="maintenance.sync_schedules"
        )
