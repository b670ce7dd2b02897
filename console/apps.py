from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operators' pages, their htmx fragments and the live updates of open pages."""

    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        # Open pages hear of every change, whichever door made it: entries changing status
        # (memory) and runs starting, progressing and ending (maintenance).
        from console import live
        from maintenance.signals import run_changed
        from memory.signals import entries_changed

        entries_changed.connect(live.on_entries_changed, dispatch_uid="console.live.entries_changed")
        run_changed.connect(live.on_run_changed, dispatch_uid="console.live.run_changed")
