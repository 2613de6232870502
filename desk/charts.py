"""The dashboard's charts, drawn on the server as SVG (no charting library, nothing from a CDN):
stacked bars, lines and horizontal bars, each with a title, a legend, an accessible label and
its numbers in a table beneath (for a screen reader, or an operator who wants the figures)."""

from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

WIDTH = 560
HEIGHT = 190
LEFT = 46  # room for the y axis's labels
RIGHT = 8
TOP = 10
BOTTOM = 34  # room for the x axis's labels and the legend


@dataclass(frozen=True)
class Series:
    key: str
    label: str
    css: str  # the colour class (desk.css: .chart-<css>)


def _nice_max(value: float) -> float:
    """The axis's top: 1, 2 or 5 times a power of ten, at least `value`."""
    if value <= 0:
        return 1
    magnitude = 1
    while magnitude * 10 <= value:
        magnitude *= 10
    while magnitude > value:
        magnitude /= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def _frame(*, chart_id: str, title: str, top: float, fmt, labels: list[str], body: str, legend: list[Series],
           table_head: list[str], table_rows: list[list[str]]) -> str:
    plot_height = HEIGHT - TOP - BOTTOM
    grid = []
    for fraction in (0, 0.5, 1):
        y = TOP + plot_height * (1 - fraction)
        grid.append(format_html('<line class="chart-grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                                '<text class="chart-tick" x="{}" y="{}" text-anchor="end">{}</text>',
                                LEFT, WIDTH - RIGHT, round(y, 1), round(y, 1), LEFT - 4, round(y + 3, 1), fmt(top * fraction)))
    plot_width = WIDTH - LEFT - RIGHT
    step = plot_width / max(len(labels), 1)
    every = max(1, len(labels) // 6)
    ticks = [
        format_html('<text class="chart-tick" x="{}" y="{}" text-anchor="middle">{}</text>',
                    round(LEFT + step * (index + 0.5), 1), HEIGHT - BOTTOM + 12, label)
        for index, label in enumerate(labels) if index % every == 0 or index == len(labels) - 1
    ]
    legend_items = format_html_join(
        "", '<g class="chart-{}"><rect x="{}" y="{}" width="10" height="10" rx="2"/><text class="chart-legend" x="{}" y="{}">{}</text></g>',
        ((s.css, LEFT + index * 86, HEIGHT - 14, LEFT + index * 86 + 14, HEIGHT - 5, s.label) for index, s in enumerate(legend)),
    )
    svg = format_html(
        '<svg class="desk-chart" id="{}" viewBox="0 0 {} {}" width="100%" role="img" aria-label="{}" xmlns="http://www.w3.org/2000/svg">'
        "<title>{}</title>{}{}{}{}</svg>",
        chart_id, WIDTH, HEIGHT, title, title, mark_safe("".join(grid)), mark_safe("".join(ticks)), mark_safe(body), legend_items,
    )
    head = format_html_join("", "<th>{}</th>", ((h,) for h in table_head))
    rows = format_html_join("", "<tr>{}</tr>", ((format_html_join("", "<td>{}</td>", ((c,) for c in row)),) for row in table_rows))
    numbers = format_html('<details class="chart-numbers"><summary>Numbers</summary><table class="desk-table">'
                          "<thead><tr>{}</tr></thead><tbody>{}</tbody></table></details>", head, rows)
    return format_html('<figure class="desk-chart-box"><figcaption>{}</figcaption>{}{}</figure>', title, svg, numbers)


def stacked_bars(*, chart_id: str, title: str, labels: list[str], values: list[dict], series: list[Series], fmt=_number) -> str:
    """One bar per label, its segments the series stacked bottom to top."""
    totals = [sum(v.get(s.key, 0) for s in series) for v in values]
    top = _nice_max(max(totals, default=0))
    plot_height = HEIGHT - TOP - BOTTOM
    step = (WIDTH - LEFT - RIGHT) / max(len(labels), 1)
    bars = []
    for index, (label, value) in enumerate(zip(labels, values)):
        base = 0.0
        for s in series:
            amount = value.get(s.key, 0)
            if not amount:
                continue
            height = plot_height * amount / top
            y = TOP + plot_height - base - height
            bars.append(format_html('<rect class="chart-{}" x="{}" y="{}" width="{}" height="{}"><title>{}: {} {}</title></rect>',
                                    s.css, round(LEFT + step * index + step * 0.15, 1), round(y, 1), round(step * 0.7, 1),
                                    round(height, 1), label, fmt(amount), s.label))
            base += height
    rows = [[label, *(fmt(v.get(s.key, 0)) for s in series)] for label, v in zip(labels, values)]
    return _frame(chart_id=chart_id, title=title, top=top, fmt=fmt, labels=labels, body="".join(bars), legend=series,
                  table_head=["", *(s.label for s in series)], table_rows=rows)


def lines(*, chart_id: str, title: str, labels: list[str], values: list[dict], series: list[Series], fmt=_number) -> str:
    """One line per series; a label without a value breaks the line (a dot marks each point)."""
    top = _nice_max(max((v.get(s.key, 0) for v in values for s in series), default=0))
    plot_height = HEIGHT - TOP - BOTTOM
    step = (WIDTH - LEFT - RIGHT) / max(len(labels), 1)
    body = []
    for s in series:
        points = []
        for index, (label, value) in enumerate(zip(labels, values)):
            if s.key not in value:
                if len(points) > 1:
                    body.append(format_html('<polyline class="chart-line chart-{}" points="{}"/>', s.css, " ".join(points)))
                points = []
                continue
            x = LEFT + step * (index + 0.5)
            y = TOP + plot_height * (1 - value[s.key] / top)
            points.append(f"{x:.1f},{y:.1f}")
            body.append(format_html('<circle class="chart-dot chart-{}" cx="{}" cy="{}" r="2.5"><title>{}: {} {}</title></circle>',
                                    s.css, f"{x:.1f}", f"{y:.1f}", label, fmt(value[s.key]), s.label))
        if len(points) > 1:
            body.append(format_html('<polyline class="chart-line chart-{}" points="{}"/>', s.css, " ".join(points)))
    rows = [[label, *(fmt(v[s.key]) if s.key in v else "—" for s in series)] for label, v in zip(labels, values)]
    return _frame(chart_id=chart_id, title=title, top=top, fmt=fmt, labels=labels, body="".join(body), legend=series,
                  table_head=["", *(s.label for s in series)], table_rows=rows)


def horizontal_bars(*, chart_id: str, title: str, items: list[tuple[str, float, str]], css: str, empty: str, fmt=_number) -> str:
    """One bar per item (label, value, link): how long each has waited, longest on top."""
    if not items:
        return format_html('<figure class="desk-chart-box"><figcaption>{}</figcaption><p class="desk-muted chart-empty" id="{}">{}</p></figure>',
                           title, chart_id, empty)
    top = _nice_max(max(value for _, value, _ in items))
    row = 18
    height = len(items) * row + 16
    label_width = 150
    plot = WIDTH - label_width - RIGHT - 60
    bars = []
    for index, (label, value, link) in enumerate(items):
        y = 4 + index * row
        bars.append(format_html(
            '<a href="{}"><text class="chart-tick" x="{}" y="{}" text-anchor="end">{}</text></a>'
            '<rect class="chart-{}" x="{}" y="{}" width="{}" height="{}"><title>{}: {}</title></rect>'
            '<text class="chart-tick" x="{}" y="{}">{}</text>',
            link, label_width - 6, y + 12, label, css, label_width, y + 2, round(max(plot * value / top, 1.5), 1), row - 5,
            label, fmt(value), round(label_width + max(plot * value / top, 1.5) + 4, 1), y + 12, fmt(value)))
    svg = format_html('<svg class="desk-chart" id="{}" viewBox="0 0 {} {}" width="100%" role="img" aria-label="{}" '
                      'xmlns="http://www.w3.org/2000/svg"><title>{}</title>{}</svg>',
                      chart_id, WIDTH, height, title, title, mark_safe("".join(bars)))
    return format_html('<figure class="desk-chart-box"><figcaption>{}</figcaption>{}</figure>', title, svg)
