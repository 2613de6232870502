"""Shared admin behaviour: the admin shows what the access policy (access.policy) lets the
user see and changes nothing directly. Every change goes through an orchestration action
(approve, reconcile, cancel pages come with their apps)."""

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import QuerySet
from django.utils.functional import cached_property

# The desk's pages need the width: the queues fit a 1280 px screen without the app list beside
# them (the breadcrumbs and the dashboard lead everywhere).
admin.site.enable_nav_sidebar = False
admin.site.site_header = "Warden — operators' desk"
admin.site.site_title = "Warden desk"
admin.site.index_title = "Dashboard"


def form_refused(form, refused) -> None:
    """A WardenError an action raised, shown on the desk form that asked for it: each field it names
    on that field (the API's `body.` prefix dropped; a field the form lacks goes on the form), or
    its message on the form."""
    for field in refused.fields or []:
        name = field["field"].removeprefix("body.")
        form.add_error(name if name in form.fields else None, field["message"])
    if not refused.fields:
        form.add_error(None, refused.message)


class EstimatedCountPaginator(Paginator):
    """Pages of a big table without counting it: unfiltered, the count is PostgreSQL's own
    estimate (pg_class.reltuples, kept by autovacuum); filtered, a real count (the filters'
    indexes make it a range). Counting every event or message to print "page 1 of N" costs
    more than the page itself."""

    @cached_property
    def count(self) -> int:
        query = getattr(self.object_list, "query", None)
        if query is None or query.has_filters() or query.distinct:
            return super().count
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [self.object_list.model._meta.db_table])
            row = cursor.fetchone()
        estimate = int(row[0]) if row else -1
        return estimate if estimate >= 10_000 else super().count  # small (or never analysed): just count


class BusinessKeySearch:
    """The search box finds rows by what an operator has in hand — an order number or any tool
    argument, a customer, a session title, an idempotency key, an id — not only by exact UUID.
    Subclasses say how with `search_business_keys(queryset, term)` (index look-ups in the
    selectors, never a scan of every row with LIKE)."""

    search_fields = ("pk",)  # shows the box; get_search_results below does the searching

    def search_business_keys(self, queryset, term: str) -> QuerySet:
        raise NotImplementedError

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        return self.search_business_keys(queryset, term), False


class FormForTheUser:
    """A ModelAdmin mixin: its form is made with the signed-in user (`user=`), for a form whose clean
    calls the action that saves it, which asks who acts (freezes, delegations, MCP servers)."""

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)

        class WithUser(form):
            def __init__(self, *args, **inner):
                super().__init__(*args, user=request.user, **inner)

        return WithUser


class ReadOnlyAdmin(admin.ModelAdmin):
    # Counts beside every filter choice cost a scan each over a big table: the desk does without.
    show_facets = admin.ShowFacets.NEVER
    # A page an operator reads, not an export; every row costs rendering time.
    list_per_page = 50
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
