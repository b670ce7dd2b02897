"""Server-side SVG charts for the console (no asset from a CDN, no JavaScript).

Pure functions: data in, SVG markup out. Every piece of text that reaches the markup goes
through ``escape`` and every number is formatted by us, so the result is marked safe only after
that. Each chart is an ``<svg role="img">`` labelled by its ``<title>`` and ``<desc>``; each bar
or point carries its own ``<title>`` (the browser's tooltip and what a screen reader reads).

A chart scales with its card through its viewBox, and its text with it: drawn 560 wide, its
11 px labels were 6 px on a phone. ``narrow=True`` draws it for a card about as wide as a
phone's (320 wide, taller, fewer labels); ``responsive`` gives both, and the stylesheet shows
the one that suits the card (a container query).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Geometry in SVG user units; the chart scales with its container through the viewBox.
WIDTH = 560
HEIGHT = 220
MARGIN_LEFT = 50  # room for the y axis label and the y tick labels (four characters: "250k")
MARGIN_RIGHT = 12
MARGIN_TOP = 12
MARGIN_BOTTOM = 44  # room for the x tick labels and the axis label
X_LABEL_DROP = 18  # x labels' baseline below the axis: clear of the y axis's "0" beside them
MAX_X_LABELS = 6  # a time axis labels at most this many points, evenly spread
MAX_BAR_WIDTH = 72.0  # wider slots centre a bar this wide
MAX_BAR_LABELS = 10  # a bar chart labels every k-th bar past this many bars
NICE_STEPS = (1.0, 2.0, 5.0)  # y tick steps: these times a power of ten
# For a card about as wide as a phone (320 to 400 px): drawn at about its size, a chart's
# labels keep their CSS size (11 px, never below 10 at 360 px); fewer of them fit.
NARROW_WIDTH = 320
NARROW_HEIGHT = 240
NARROW_X_LABELS = 4
NARROW_BAR_LABELS = 5


def _num(value: float) -> str:
    """A coordinate or count as short text: no exponent, at most two decimals."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _tick(value: float) -> str:
    """A y tick's label, at most four characters for the counts a chart shows: thousands as
    "k", millions as "M" (a wider label would run into the axis label beside it)."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return _num(value)


def _plot_box(width: int, height: int) -> tuple[float, float, float, float]:
    """x0, y0 (top), plot width, plot height."""
    return (
        MARGIN_LEFT,
        MARGIN_TOP,
        width - MARGIN_LEFT - MARGIN_RIGHT,
        height - MARGIN_TOP - MARGIN_BOTTOM,
    )


def _open(
    chart_id: str, title: str, description: str, width: int, height: int, narrow: bool = False
) -> list[str]:
    cid = escape(chart_id)
    css = "chart narrow" if narrow else "chart"
    return [
        f'<svg class="{css}" id="{cid}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{cid}-title {cid}-desc" preserveAspectRatio="xMidYMid meet">',
        f'<title id="{cid}-title">{escape(title)}</title>',
        f'<desc id="{cid}-desc">{escape(description)}</desc>',
    ]


def _nice_ticks(top: float) -> tuple[float, list[float]]:
    """The top of a linear y axis and its tick values: at most five ticks on a round step (1, 2
    or 5 times a power of ten, never below 1: the charts count things), the top on a tick."""
    rough = max(top / 4, 1.0)
    power = 10 ** math.floor(math.log10(rough))
    step = next((m * power for m in NICE_STEPS if m * power >= rough - 1e-9), 10 * power)
    axis_top = math.ceil(top / step - 1e-9) * step
    ticks = [i * step for i in range(round(axis_top / step) + 1)]
    return axis_top, ticks


def _log_fraction(value: float, top: float) -> float:
    return math.log10(1 + value) / math.log10(1 + top)


def _axes(
    width: int,
    height: int,
    ticks: Sequence[tuple[float, float]],
    x_label: str,
    y_label: str,
) -> list[str]:
    """Both axes, the y ticks ((value, fraction of the plot height)) and the axis labels."""
    x0, y0, pw, ph = _plot_box(width, height)
    base = y0 + ph
    parts = [
        f'<line class="axis" x1="{_num(x0)}" y1="{_num(base)}" x2="{_num(x0 + pw)}" y2="{_num(base)}"/>',
        f'<line class="axis" x1="{_num(x0)}" y1="{_num(y0)}" x2="{_num(x0)}" y2="{_num(base)}"/>',
    ]
    for value, fraction in ticks:
        y = base - ph * fraction
        parts.append(
            f'<line class="grid" x1="{_num(x0)}" y1="{_num(y)}" x2="{_num(x0 + pw)}" y2="{_num(y)}"/>'
        )
        parts.append(
            f'<text class="tick" x="{_num(x0 - 4)}" y="{_num(y + 4)}" text-anchor="end">{_tick(value)}</text>'
        )
    parts.append(
        f'<text class="axis-label" x="{_num(x0 + pw / 2)}" y="{_num(height - 4)}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text class="axis-label" x="12" y="{_num(y0 + ph / 2)}" text-anchor="middle" '
        f'transform="rotate(-90 12 {_num(y0 + ph / 2)})">{escape(y_label)}</text>'
    )
    return parts


def _linear(values: Sequence[float]) -> tuple[float, list[tuple[float, float]]]:
    top, ticks = _nice_ticks(_top(values))
    return top, [(t, t / top) for t in ticks]


def _empty(parts: list[str], width: int, height: int, message: str) -> SafeString:
    parts.append(
        f'<text class="empty" x="{_num(width / 2)}" y="{_num(height / 2)}" '
        f'text-anchor="middle">{escape(message)}</text>'
    )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # safe: every text above is escaped


def _top(values: Sequence[float]) -> float:
    """The top of the y axis: the largest value, at least 1 (an all-zero chart still has a scale)."""
    return max([1.0, *values])


def bar_chart(
    bars: Sequence[tuple[str, float]],
    *,
    chart_id: str,
    title: str,
    x_label: str,
    y_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    log_scale: bool = False,
    narrow: bool = False,
) -> SafeString:
    """A vertical bar chart, one ``<rect class="bar">`` per (label, value); past
    ``MAX_BAR_LABELS`` bars (``NARROW_BAR_LABELS`` narrow) every k-th bar is labelled
    underneath (each bar's ``<title>`` names it). ``log_scale``: heights by log(1 + value), so
    that a bin of 3 still shows beside one of 3,000 (the y ticks say so: 0, 1, 10, 100, …)."""
    if narrow:
        width, height = NARROW_WIDTH, NARROW_HEIGHT
    scale = "log scale" if log_scale else "linear scale"
    description = f"{len(bars)} bars: {x_label} against {y_label} ({scale})"
    parts = _open(chart_id, title, description, width, height, narrow)
    if not bars:
        return _empty(parts, width, height, "No data yet")
    values = [max(0.0, float(v)) for _, v in bars]
    if log_scale:
        top = _top(values)
        marks = [0.0] + [10.0**k for k in range(math.floor(math.log10(top)) + 1)]
        if top > marks[-1] * 1.5:
            marks.append(top)
        ticks = [(m, _log_fraction(m, top)) for m in marks]

        def fraction(value: float) -> float:
            return _log_fraction(value, top)
    else:
        top, ticks = _linear(values)

        def fraction(value: float) -> float:
            return value / top

    parts += _axes(width, height, ticks, x_label, y_label)
    x0, y0, pw, ph = _plot_box(width, height)
    slot = pw / len(bars)
    gap = max(min(4.0, slot * 0.15), slot - MAX_BAR_WIDTH)  # a lone bar stays a bar, not a block
    base = y0 + ph
    every = math.ceil(len(bars) / (NARROW_BAR_LABELS if narrow else MAX_BAR_LABELS))
    for i, ((label, _), value) in enumerate(zip(bars, values, strict=True)):
        h = ph * fraction(value)
        x = x0 + i * slot + gap / 2
        text = escape(label)
        parts.append(
            f'<rect class="bar" x="{_num(x)}" y="{_num(base - h)}" width="{_num(slot - gap)}" '
            f'height="{_num(h)}"><title>{text}: {_num(value)}</title></rect>'
        )
        if i % every == 0:
            parts.append(
                f'<text class="tick" x="{_num(x0 + (i + 0.5) * slot)}" y="{_num(base + X_LABEL_DROP)}" '
                f'text-anchor="middle">{text}</text>'
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # safe: labels escaped, numbers formatted here


def time_series(
    points: Sequence[tuple[str, float]],
    *,
    chart_id: str,
    title: str,
    x_label: str,
    y_label: str,
    width: int = WIDTH,
    height: int = HEIGHT,
    narrow: bool = False,
) -> SafeString:
    """A line through (label, value) points in order, one ``<circle class="point">`` each; at
    most ``MAX_X_LABELS`` labels on the x axis (``NARROW_X_LABELS`` narrow), always the first
    and the last."""
    if narrow:
        width, height = NARROW_WIDTH, NARROW_HEIGHT
    parts = _open(chart_id, title, f"{len(points)} points: {y_label} by {x_label}", width, height, narrow)
    if not points:
        return _empty(parts, width, height, "No data yet")
    values = [max(0.0, float(v)) for _, v in points]
    top, ticks = _linear(values)
    parts += _axes(width, height, ticks, x_label, y_label)
    x0, y0, pw, ph = _plot_box(width, height)
    base = y0 + ph
    step = pw / (len(points) - 1) if len(points) > 1 else 0.0
    xs = [x0 + i * step if len(points) > 1 else x0 + pw / 2 for i in range(len(points))]
    ys = [base - ph * v / top for v in values]
    path = " ".join(f"{_num(x)},{_num(y)}" for x, y in zip(xs, ys, strict=True))
    parts.append(
        f'<polygon class="area" points="{_num(xs[0])},{_num(base)} {path} {_num(xs[-1])},{_num(base)}"/>'
    )
    parts.append(f'<polyline class="line" points="{path}"/>')
    shown = min(len(points), NARROW_X_LABELS if narrow else MAX_X_LABELS)
    last = len(points) - 1
    labelled = {round(j * last / (shown - 1)) for j in range(shown)} if shown > 1 else {0}
    for i, ((label, _), x, y, value) in enumerate(zip(points, xs, ys, values, strict=True)):
        text = escape(label)
        parts.append(
            f'<circle class="point" cx="{_num(x)}" cy="{_num(y)}" r="3">'
            f"<title>{text}: {_num(value)}</title></circle>"
        )
        if i in labelled:
            # The end labels hang inwards so that they are never cut off at the edges.
            anchor = "start" if i == 0 and last else "end" if i == last and last else "middle"
            parts.append(
                f'<text class="tick" x="{_num(x)}" y="{_num(base + X_LABEL_DROP)}" '
                f'text-anchor="{anchor}">{text}</text>'
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # safe: labels escaped, numbers formatted here


def responsive(
    draw: Callable[..., SafeString], data: Sequence[tuple[str, float]], **options: Any
) -> SafeString:
    """``draw`` (``bar_chart`` or ``time_series``) twice: for a wide card, then narrow for a
    phone's (its id ends in ``-narrow``). The stylesheet shows one of them."""
    chart_id = options.pop("chart_id")
    wide = draw(data, chart_id=chart_id, **options)
    return wide + draw(data, chart_id=f"{chart_id}-narrow", narrow=True, **options)
