"""CSV export of a desk list (issue 29): the rows the list's filters and search select — all of
them, not the page — in the columns it shows, as the access policy lets the operator see them (the
list's own queryset), audited before the first row leaves (engine.actions.desk_lists), streamed.
A cell a spreadsheet would run as a formula (= + - @, a tab or a carriage return first) is quoted
with a leading apostrophe (OWASP's CSV injection advice)."""

import csv
import html
import re
from collections.abc import Iterator

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import display_for_field, display_for_value, label_for_field, lookup_field
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpResponseRedirect, StreamingHttpResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import strip_tags

from engine.actions.desk_lists import list_export_record

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
EXPORT_CHUNK_ROWS = 500
_LINE_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


def csv_safe(text: str) -> str:
    """A cell no spreadsheet evaluates: one that would start a formula gets an apostrophe first."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def cell_text(value) -> str:
    """A list cell as plain text: its HTML's words, line breaks as " · ", entities decoded."""
    text = _LINE_BREAK.sub(" · ", str(value))
    return " ".join(html.unescape(strip_tags(text)).split())


class _Echo:
    """csv.writer writes to this and gets the line back, so each row is yielded as it is made."""

    def write(self, value: str) -> str:
        return value


class CsvExportMixin:
    """A desk list with an "Export CSV" link that keeps its filters (the list's template:
    admin/desk/change_list_export.html). Mixed in before the ModelAdmin base; `csv_exclude` names
    columns that are controls, not data (buttons, the checkbox)."""

    change_list_template = "admin/desk/change_list_export.html"
    csv_exclude: tuple[str, ...] = ()

    def get_urls(self):
        info = self.model._meta.app_label, self.model._meta.model_name
        return [path("export.csv", self.admin_site.admin_view(self.export_csv_view), name="%s_%s_export_csv" % info),
                *super().get_urls()]

    def has_export_permission(self, request) -> bool:
        # Who may read the list may take it away: its rows are still only those they may see.
        return self.has_view_permission(request)

    def csv_columns(self, changelist) -> list:
        return [name for name in changelist.list_display
                if name != "action_checkbox" and getattr(name, "__name__", name) not in self.csv_exclude]

    def csv_cell(self, name, obj) -> str:
        """A cell as the list shows it (admin_list.items_for_result's rules), as plain text."""
        empty = self.get_empty_value_display()
        try:
            field, attr, value = lookup_field(name, obj, self)
        except models.ObjectDoesNotExist:
            return ""
        if getattr(attr, "boolean", False) or isinstance(field, models.BooleanField):
            return "" if value is None else ("yes" if value else "no")  # not the list's icon
        if field is None or field.auto_created:
            shown = display_for_value(value, empty)
        elif isinstance(field.remote_field, models.ManyToOneRel):
            shown = empty if value is None else getattr(obj, field.name)
        else:
            shown = display_for_field(value, field, empty)
        return csv_safe(cell_text(shown))

    def export_csv_view(self, request):
        if not self.has_export_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseRedirect(request.path.rsplit("export.csv", 1)[0])
        columns = self.csv_columns(changelist)
        headers = [cell_text(label_for_field(name, self.model, self)) for name in columns]
        rows = changelist.queryset
        list_export_record(acting_user=request.user, list_name=str(self.model._meta.verbose_name),
                           filters=dict(request.GET.items()), rows=rows.count(), columns=headers)
        filename = f"{self.model._meta.model_name}-{timezone.localtime().strftime('%Y%m%d-%H%M%S')}.csv"
        response = StreamingHttpResponse(self._csv_lines(rows, columns, headers), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    def _csv_lines(self, rows, columns, headers) -> Iterator[str]:
        writer = csv.writer(_Echo())
        yield writer.writerow([csv_safe(header) for header in headers])
        for obj in rows.iterator(chunk_size=EXPORT_CHUNK_ROWS):
            yield writer.writerow([self.csv_cell(name, obj) for name in columns])
