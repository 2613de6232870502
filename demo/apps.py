from django.apps import AppConfig

from cli.banner import banner_section_add
from demo.accounts import DEMO_CUSTOMER, DEMO_OPERATOR


class DemoWorldConfig(AppConfig):
    name = "demo"
    label = "demo"
    verbose_name = "Demo world (simulated order and payment service)"

    def ready(self):
        # The desk's panel of demo controls is added by demo/admin.py, which the admin imports.
        banner_section_add(banner_lines)


def banner_lines(env: dict[str, str]) -> list[str]:
    """What `serve_all` prints about the demo world (cli/banner.py)."""
    sim = env["WARDEN_SIM_BASE_URL"]
    return [
        f"payment sim  {sim.rstrip('/')}/ (demo mode)",
        f"webhooks     {sim.rstrip('/')}/webhooks/ (the demo receiver)",
        f"operator     {DEMO_OPERATOR[0]} / {DEMO_OPERATOR[1]}",
        f"customer     {DEMO_CUSTOMER[0]} / {DEMO_CUSTOMER[1]}",
        "walk-through docs/DEMO.md (every path of the refund scenario, from the UI)",
    ]
