"""Template tags of the operators' desk: the overview on the admin index."""

from django import template

from approvals_app.selectors import desk_overview as desk_overview_select

register = template.Library()


@register.simple_tag(takes_context=True)
def desk_overview(context):
    """The overview for staff on the admin index; None for anyone else."""
    request = context.get("request")
    if request is None or not request.user.is_active or not request.user.is_staff:
        return None
    return desk_overview_select()
