"""What an operator does with a list of the desk besides reading it (issue 29): keep it as a named
view of their own, and take it away as a file. The list itself is the interface's; these are the
writes, each checked and, for an export, audited — who took which rows out, with which filters."""

from django.db import transaction

from access import policy as access
from approvals_app.models import SavedView
from approvals_app.services import (
    SAVED_VIEW_NAME_CHARS, SAVED_VIEW_URL_CHARS, audit_record, saved_view_create, saved_view_delete,
)
from config.errors import CommonRefusal, WardenError


def saved_view_save(*, owner, name: str, url: str) -> SavedView:
    """`owner`'s view `name` of the list at `url` (a path of this site with its query string); a
    name saved again points at the new list. The interface checks that `url` is one of its lists."""
    if not access.is_active(owner):
        raise WardenError(CommonRefusal.NOT_PERMITTED, "Sign in with an active account to save a view.")
    name = " ".join((name or "").split())
    if not name:
        raise WardenError(CommonRefusal.BAD_REQUEST, "Give the view a name.")
    if len(name) > SAVED_VIEW_NAME_CHARS:
        raise WardenError(CommonRefusal.BAD_REQUEST, f"A view's name may hold at most {SAVED_VIEW_NAME_CHARS} characters.")
    if not url.startswith("/") or url.startswith("//") or len(url) > SAVED_VIEW_URL_CHARS:
        raise WardenError(CommonRefusal.BAD_REQUEST, "A view is a list of this desk, at most "
                                                     f"{SAVED_VIEW_URL_CHARS} characters of address.")
    return saved_view_create(owner=owner, name=name, url=url)


def saved_view_remove(*, owner, saved_view_id: int) -> None:
    """Delete one of `owner`'s own views; anyone else's is not found for them."""
    if not saved_view_delete(owner=owner, saved_view_id=saved_view_id):
        raise WardenError(CommonRefusal.NOT_FOUND, "You have no such saved view.")


def list_export_record(*, acting_user, list_name: str, filters: dict[str, str], rows: int, columns: list[str]) -> None:
    """The audit entry of an export, written before the first row leaves: who, which list, the
    filters and search it had applied, how many rows and which columns."""
    with transaction.atomic():
        audit_record(actor=acting_user, action="export", object_type=f"{list_name} list"[:40], object_id="",
                     before={}, after={"filters": filters, "rows": rows, "columns": columns},
                     note=f"CSV export of {rows} row{'' if rows == 1 else 's'} of the {list_name} list")
