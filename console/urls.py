from django.urls import path

from console import decide, views

app_name = "console"

urlpatterns = [
    path("", views.console_home, name="home"),
    path("login/", views.ConsoleLoginView.as_view(), name="login"),
    path("logout/", views.ConsoleLogoutView.as_view(), name="logout"),
    path("sessions/new/", views.console_session_new, name="session_new"),
    path("sessions/states/", views.console_session_states, name="session_states"),
    path("sessions/<uuid:session_id>/", views.console_session, name="session"),
    path("sessions/<uuid:session_id>/messages/", views.console_message_post_view, name="message_post"),
    path("runs/<uuid:run_id>/", views.console_run, name="run"),
    path("runs/<uuid:run_id>/cancel/", views.console_run_cancel_view, name="run_cancel"),
    path("held-inputs/<int:pending_id>/", views.console_held_input_view, name="held_input"),
    path("approvals/<uuid:approval_id>/decide/", views.console_approval_decide_view, name="approval_decide"),
    # The link a decision notification carries (approvals_app.links): the token is the signed link id.
    path("decide/<str:token>/", decide.console_decide_view, name="decide"),
    path("assets/<path:path>", views.console_asset, name="asset"),
]
