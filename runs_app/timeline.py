"""The timeline picture of a run (console and desk): its states, steps and tool calls as bars on
one time axis, as SVG geometry the templates draw. Geometry only: the callers read the rows."""

from datetime import datetime

from runs_app.models import TERMINAL_STATUSES, Run, RunStatus, Step

TIMELINE_WIDTH = 720
TIMELINE_LABEL_WIDTH = 96
TIMELINE_PLOT_WIDTH = TIMELINE_WIDTH - TIMELINE_LABEL_WIDTH - 8
TIMELINE_MAX_TOOL_ROWS = 6


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} m"


def run_state_key(payload: dict) -> str:
    """What a `run_status` event says the run is doing: its phase while running, its wait while waiting, else its status."""
    status = payload.get("status", "")
    if status == RunStatus.RUNNING:
        return payload.get("phase") or "running"
    if status == RunStatus.WAITING:
        return f"waiting_{payload.get('wait_reason') or 'other'}"
    return status


def run_timeline(*, run: Run, events: list[dict], steps: list[Step], calls: list, now: datetime) -> dict:
    """Where the run's time went: its states (from the run_status events), its steps and its
    tool calls, as bars on one time axis from creation to the end (or now)."""
    start = run.created_at
    end = run.finished_at or now
    total = max((end - start).total_seconds(), 0.001)

    def x_of(moment: datetime) -> float:
        offset = min(max((moment - start).total_seconds(), 0.0), total)
        return TIMELINE_LABEL_WIDTH + offset / total * TIMELINE_PLOT_WIDTH

    def bar(begin: datetime, finish: datetime, *, label: str, css: str, row: int) -> dict:
        seconds = max((finish - begin).total_seconds(), 0.0)
        x = x_of(begin)
        width = max(x_of(finish) - x, 1.5)
        text = f"{label} {duration_text(seconds)}"
        return {"x": round(x, 1), "text_x": round(x + 3, 1), "width": round(width, 1), "css": css, "row": row, "title": text,
                "label": text if width >= 8 * len(text) * 0.75 else (label if width >= 7 * len(label) else "")}

    marks = [(e["created_at"], run_state_key(e["payload"])) for e in events if e["type"] == "run_status"]
    states, totals = [], {}
    for position, (moment, key) in enumerate(marks):
        if key in TERMINAL_STATUSES:
            break
        finish = marks[position + 1][0] if position + 1 < len(marks) else end
        label = key.replace("waiting_", "waiting: ").replace("_", " ")
        states.append(bar(moment, finish, label=label, css=f"state-{key}", row=0))
        totals[label] = totals.get(label, 0.0) + max((finish - moment).total_seconds(), 0.0)

    step_bars = [
        bar(step.started_at, step.finished_at or end, label=f"{step.kind} #{step.index}",
            css=f"step-{step.kind} step-{step.status}", row=1)
        for step in steps
    ]
    tool_bars = []
    for position, call in enumerate(calls[: TIMELINE_MAX_TOOL_ROWS]):
        row = 2 + position
        if call.started_at and call.started_at > call.created_at:
            tool_bars.append(bar(call.created_at, call.started_at, label="pending", css="tool-pending", row=row))
        if call.started_at:
            tool_bars.append(bar(call.started_at, call.finished_at or end, label=call.tool_name,
                                 css=f"tool-{call.status}", row=row))
        else:
            tool_bars.append(bar(call.created_at, call.finished_at or end, label=f"{call.tool_name} (not started)",
                                 css=f"tool-pending tool-{call.status}", row=row))
    rows = [("state", 0), ("steps", 1)] + [
        (call.tool_name[:14], 2 + position) for position, call in enumerate(calls[: TIMELINE_MAX_TOOL_ROWS])
    ]
    row_height = 20
    height = len(rows) * row_height + 22
    ticks = [
        {"x": round(TIMELINE_LABEL_WIDTH + fraction * TIMELINE_PLOT_WIDTH, 1), "label": duration_text(total * fraction),
         "anchor": "start" if fraction == 0 else ("end" if fraction == 1 else "middle")}
        for fraction in (0, 0.25, 0.5, 0.75, 1)
    ]
    for item in states + step_bars + tool_bars:
        item["y"] = item["row"] * row_height + 2
        item["text_y"] = item["y"] + 12
    return {
        "width": TIMELINE_WIDTH,
        "height": height,
        "row_height": row_height - 4,
        "bars": states + step_bars + tool_bars,
        "rows": [{"label": label, "y": row * row_height + 14} for label, row in rows],
        "axis_y": len(rows) * row_height + 4,
        "ticks": ticks,
        "tick_y": len(rows) * row_height + 18,
        "plot_x": TIMELINE_LABEL_WIDTH,
        "plot_end": TIMELINE_LABEL_WIDTH + TIMELINE_PLOT_WIDTH,
        "total": duration_text(total),
        "ongoing": run.finished_at is None,
        "summary": [f"{label} {duration_text(seconds)}" for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1])],
    }
