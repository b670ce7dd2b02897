from django.apps import AppConfig


class CliConfig(AppConfig):
    """The management commands (``manage.py <command>``): an interface over memory and
    maintenance, like the API and the console."""

    name = "cli"
    verbose_name = "Commands"
