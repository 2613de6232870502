from django.apps import AppConfig


class DeskConfig(AppConfig):
    """The operators' desk: the Django admin. Its ModelAdmins (one module per resource, registered
    by desk/admin.py, which the admin's autodiscovery imports), views, charts, template tags and
    static files live here; the domain apps hold no interface code."""

    name = "desk"
    verbose_name = "Operators' desk"
