"""Shared admin behaviour: the admin shows what the access policy (sessions_app.access) lets the
user see and changes nothing directly. Every change goes through an orchestration action
(approve, reconcile, cancel pages come with their apps)."""

from django.contrib import admin
from django.db.models import QuerySet


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        # View-only: staff with the view permission see the change page, read-only.
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PolicyScopedAdmin(ReadOnlyAdmin):
    """A desk list scoped by the access policy, not by Django's per-model permissions: `visible`
    returns the rows the policy lets `user` see, `can_see` answers for one row. The admin site
    admits only active staff; inside it every staff member sees what the policy allows (their
    own sessions at least)."""

    def visible(self, user) -> QuerySet:
        raise NotImplementedError

    def can_see(self, user, obj) -> bool:
        return self.visible(user).filter(pk=obj.pk).exists()

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        visible = self.visible(request.user)
        if not visible.query.has_filters():
            return queryset  # everything: no subquery to pay for
        return queryset.filter(pk__in=visible.values("pk"))

    def has_view_permission(self, request, obj=None):
        return obj is None or self.can_see(request.user, obj)

    def has_module_permission(self, request):
        return True


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        # The parent's page is already scoped by the policy; its inlines show that object's parts.
        return True
