"""The demo world on the operators' desk (demo mode only, like the whole app): the buttons that arm
the simulated gateway's faults, a panel on the desk's home page (desk/panels.py), and the view
they post to, a URL of the simulated faults' admin — which is otherwise hidden: the gateway's
state is the simulator's own business."""

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse

from access import policy as access
from approvals_app.services import audit_record
from demo.client import FAULT_PRESETS, SimUnavailable, sim_fault_arm, sim_faults_clear
from demo.models import SimFault
from desk.panels import DeskPanel, desk_panel_add


def desk_controls(request) -> dict | None:
    """The demo buttons' panel, in demo mode, for those the access policy lets arm faults."""
    if not settings.WARDEN_DEMO or not access.can_arm_demo_faults(user=request.user):
        return None
    return {"presets": FAULT_PRESETS, "url": reverse("admin:demo_simfault_arm")}


desk_panel_add(DeskPanel(template="demo/desk_controls.html", context=desk_controls))


def demo_faults_arm_view(request):
    """POST only, demo mode only: arm one of the simulated gateway's fault presets (or clear them
    all) by calling the service over HTTP, as the demo tools reach it. Audited."""
    if not settings.WARDEN_DEMO:
        raise Http404("The demo controls exist in demo mode only.")
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not access.can_arm_demo_faults(user=request.user):
        raise PermissionDenied
    preset = request.POST.get("preset", "")
    back = HttpResponseRedirect(reverse("admin:index") + "#desk-demo")
    if preset != "clear" and preset not in FAULT_PRESETS:
        messages.error(request, f"No such demo fault: {preset!r}.")
        return back
    try:
        if preset == "clear":
            cleared = sim_faults_clear()
            armed = []
        else:
            armed = sim_fault_arm(preset=preset)
    except SimUnavailable as error:
        messages.error(request, f"Nothing armed: {error}.")
        return back
    fault = FAULT_PRESETS.get(preset, {}).get("fault", {})
    audit_record(actor=request.user, action="demo_fault_clear" if preset == "clear" else "demo_fault_arm",
                 object_type="simfault", object_id=fault.get("target", "all"), before={},
                 after={"preset": preset, **fault} if fault else {"cleared": cleared})
    if preset == "clear":
        messages.success(request, f"Demo faults cleared ({cleared}). The simulated gateway behaves normally.")
    else:
        now_armed = ", ".join(f"{f['target']}: {f['mode'].replace('_', ' ')}"
                              f" ({'until cleared' if f['remaining'] == -1 else str(f['remaining']) + ' left'})" for f in armed)
        messages.success(request, f"Armed: {FAULT_PRESETS[preset]['label']}. {FAULT_PRESETS[preset]['help']} "
                                  f"Armed now — {now_armed or 'nothing'}.")
    return back


@admin.register(SimFault)
class SimFaultAdmin(admin.ModelAdmin):
    """Only the arm view: no list or form of the simulator's rows on the desk."""

    def has_module_permission(self, request) -> bool:
        return False

    def get_urls(self):
        return [path("arm/", self.admin_site.admin_view(demo_faults_arm_view), name="demo_simfault_arm")]
