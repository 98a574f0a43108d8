"""Draws a /render graph with matplotlib (Agg for PNG, its SVG backend): run in a drawing process.

``gateway.query.graphite.graph`` checks the options and hands the evaluated series over; this module
is only imported by the drawing processes, so the gateway's own process never loads matplotlib.
The look follows graphite-web's line graph: series in ``colorList`` order (a colour set by
``color()`` wins), a legend under the plot up to LEGEND_MAX_ITEMS series, the title on top, the
series options set by render functions (``alpha``, ``lineWidth``, ``dashed``, ``stacked``,
``areaBetween``, ``secondYAxis``, ``drawAsInfinite``) honoured. Each series' line is an SVG
group whose id is ``series_<n>`` (its fill ``area_<n>``), n counting from 0 in target order.
"""

import io
import itertools
import math
import re
import warnings
from typing import Any

import numpy as np
from matplotlib import dates, rc_context
from matplotlib.figure import Figure
from matplotlib.ticker import AutoMinorLocator, EngFormatter

from gateway.query.graphite.graph import MAX_LINE_WIDTH, GraphOptions, parse_color

DPI = 72  # one point is one pixel: lineWidth and fontSize read as pixels, as in graphite-web
LEGEND_MAX_ITEMS = 10  # graphite-web's LEGEND_MAX_ITEMS: more series and the legend is left out
_METADATA = {"png": {"Software": "tsgate"}, "svg": {"Creator": "tsgate", "Date": None}}
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_SVG_SIZE = re.compile(rb'\b((?:width|height)="[0-9.]+)pt"')
# The largest magnitude drawn: matplotlib's tick arithmetic overflows on an axis near ±1.8e308
# (threshold(1e308) failed to draw); values and yMin/yMax beyond it are drawn at it.
AXIS_LIMIT = 1e300


def draw(options: GraphOptions, series_list) -> bytes:
    """The picture's bytes in ``options.format``."""
    settings: dict[Any, Any] = {
        "font.size": options.font_size,
        "text.parse_math": False,  # a "$" in a title or a series name is text, not TeX
        "svg.fonttype": "none",  # text stays text in SVG (searchable, selectable)
        "svg.hashsalt": "tsgate",  # the same graph gives the same SVG
        "axes.autolimit_mode": "round_numbers",
    }
    with rc_context(settings), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a layout too small for its legend: drawn anyway
        figure = _figure(options, series_list)
        buffer = io.BytesIO()
        figure.savefig(buffer, format=options.format, dpi=DPI, metadata=_METADATA[options.format])
    body = buffer.getvalue()
    if options.format == "svg":  # sized in pixels, as graphite-web's SVG (matplotlib writes points)
        start = body.index(b"<svg")
        end = body.index(b">", start)
        body = body[:start] + _SVG_SIZE.sub(rb'\1px"', body[start:end]) + body[end:]
    return body


def _text(text: str) -> str:
    """Text as drawn: characters XML cannot hold (NUL, other controls) would make the SVG unreadable."""
    return _NOT_XML.sub("\ufffd", str(text))


def _figure(options: GraphOptions, series_list) -> Figure:
    figure = Figure(
        figsize=(options.width / DPI, options.height / DPI),
        dpi=DPI,
        facecolor=options.background,
        layout=None if options.graph_only else "constrained",
    )
    if not series_list:
        figure.text(0.5, 0.5, "No Data", color=options.foreground, ha="center", va="center")
        return figure
    axes = figure.add_axes((0, 0, 1, 1)) if options.graph_only else figure.add_subplot()
    right = axes.twinx() if any(s.options.get("secondYAxis") for s in series_list) else None
    plotted = _plot(options, series_list, axes, right)
    first = min(series.start for series in series_list)
    last = max(series.end for series in series_list)
    axes.set_xlim(np.datetime64(int(first), "s"), np.datetime64(int(last), "s"))  # type: ignore[arg-type]  # dates: matplotlib converts them
    for each in (axes, right):
        if each is not None:
            _style(options, each)
    if options.y_min is not None or options.y_max is not None:
        axes.set_ylim(bottom=_on_axis(options.y_min), top=_on_axis(options.y_max))
    for each, fills in plotted.items():
        _fill(each, fills)
    if not options.graph_only:
        if options.title:
            axes.set_title(_text(options.title), color=options.foreground)
        if options.vtitle:
            axes.set_ylabel(_text(options.vtitle), color=options.foreground)
        _legend(options, figure, series_list, [handle for fills in plotted.values() for handle in fills["legend"]])
    return figure


def _points(options: GraphOptions, series, pixels: int) -> tuple[np.ndarray, np.ndarray]:
    """Times and values, one point per pixel column at most (the series' consolidation function,
    as graphite-web); null (NaN) where nothing is drawn."""
    per_pixel = math.ceil(len(series) / max(1, pixels))
    if per_pixel > 1:
        series.consolidate(per_pixel)
    values = np.array(list(series), dtype=np.float64)  # None -> NaN
    if options.draw_null_as_zero:
        values[np.isnan(values)] = 0.0
    values[np.isinf(values)] = np.nan  # an infinity has no place on the axis
    values = _on_axis(values)
    step = int(series.step) * max(1, series.valuesPerPoint)
    times = (int(series.start) + step * np.arange(len(values), dtype=np.int64)).astype("datetime64[s]")
    return times, values


def _plot(options: GraphOptions, series_list, axes, right) -> dict:
    """Draws every line; returns, per axes, the areas to fill once its limits are known and the legend handles."""
    colors = itertools.cycle(options.colors)
    plotted: dict = {each: {"areas": [], "floor": None, "total": None, "legend": []} for each in (axes, right) if each}
    for index, series in enumerate(series_list):
        opts = series.options
        color = parse_color(str(opts["color"]), "target") if "color" in opts else next(colors)
        width = _clamped(opts.get("lineWidth"), 0.0, MAX_LINE_WIDTH, options.line_width)
        alpha = _clamped(opts.get("alpha"), 0.0, 1.0, None)
        fill_alpha = alpha if options.area_alpha is None else options.area_alpha
        target = right if right is not None and opts.get("secondYAxis") else axes
        state = plotted[target]
        times, values = _points(options, series, options.width)
        if opts.get("drawAsInfinite"):
            lines = target.vlines(
                times[np.nan_to_num(values) != 0],
                0,
                1,
                transform=target.get_xaxis_transform(),
                colors=[color],
                linewidth=width,
                alpha=alpha,
                gid=f"series_{index}",
            )
            state["legend"].append((lines, series.name))
            continue
        if options.area_mode == "stacked" and target is axes:
            total = _same_length(state["total"], values)
            total = np.zeros(len(values)) if total is None else total
            own, values = values, _on_axis(total + values)
            state["total"] = total + np.nan_to_num(own)
            state["areas"].append((index, times, total, values, color, fill_alpha))
        elif opts.get("stacked") or (options.area_mode == "first" and index == 0):
            lower = _same_length(state["floor"], values)
            state["floor"] = values
            if not opts.get("invisible"):
                state["areas"].append((index, times, lower, values, color, fill_alpha))
        elif options.area_mode == "all":
            state["areas"].append((index, times, None, values, color, fill_alpha))
        if opts.get("invisible"):
            continue
        if options.line_mode == "connected":
            drawn = ~np.isnan(values)
            times, values = times[drawn], values[drawn]
        dashes = _clamped(opts.get("dashed"), 0.0, MAX_LINE_WIDTH * 10, None)
        (line,) = target.plot(
            times,
            values,
            color=color,
            linewidth=width,
            alpha=alpha,
            drawstyle="steps-post" if options.line_mode == "staircase" else "default",
            linestyle=(0, (float(dashes) / width, float(dashes) / width)) if dashes and width else "-",
            gid=f"series_{index}",
        )
        state["legend"].append((line, series.name))
    return plotted


def _on_axis(values):
    """Values (an array, a number or None) within what the axis can draw."""
    return None if values is None else np.clip(values, -AXIS_LIMIT, AXIS_LIMIT)


def _clamped(value, low: float, high: float, default):
    """A number a render function set (``alpha(x, 5)``, ``lineWidth(x, -1)``) within what can be
    drawn; the default when unset or not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return min(max(number, low), high) if math.isfinite(number) else default


def _same_length(below: np.ndarray | None, values: np.ndarray) -> np.ndarray | None:
    """What a series stacks on: nothing when the series below has another step (another length)."""
    return below if below is not None and len(below) == len(values) else None


def _fill(axes, state: dict) -> None:
    """The areas, from the series below (stacked, areaBetween) or from the bottom of the axis."""
    bottom, top = axes.get_ylim()
    for index, times, lower, upper, color, alpha in state["areas"]:
        floor = np.full(len(upper), bottom) if lower is None else np.where(np.isnan(lower), bottom, lower)
        axes.fill_between(
            times,
            floor,
            upper,
            where=~np.isnan(upper),
            color=color,
            alpha=alpha,
            linewidth=0,
            gid=f"area_{index}",
        )
    axes.set_ylim(bottom, top)  # the fills do not move the limits the lines set


def _style(options: GraphOptions, axes) -> None:
    axes.set_facecolor(options.background)
    axes.margins(x=0, y=0)  # round_numbers then rounds the data limits out to ticks, as graphite-web
    axes.set_axisbelow(True)
    if options.hide_axes or options.graph_only:
        axes.xaxis.set_visible(False)
        axes.yaxis.set_visible(False)
        for spine in axes.spines.values():
            spine.set_visible(False)
        return
    locator = dates.AutoDateLocator(tz=options.tz)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=options.tz))
    axes.yaxis.set_major_formatter(EngFormatter(sep=""))
    axes.tick_params(colors=options.foreground, which="both")
    for spine in axes.spines.values():
        spine.set_edgecolor(options.foreground)
    axes.xaxis.get_offset_text().set_color(options.foreground)
    if not options.hide_grid:
        axes.xaxis.set_minor_locator(AutoMinorLocator(2))  # one minor line between two times
        axes.yaxis.set_minor_locator(AutoMinorLocator())
        axes.grid(True, which="minor", color=options.minor_grid, linewidth=0.5)
        axes.grid(True, which="major", color=options.major_grid, linewidth=0.8)


def _legend(options: GraphOptions, figure: Figure, series_list, handles: list) -> None:
    shown = options.hide_legend is False or (options.hide_legend is None and len(series_list) <= LEGEND_MAX_ITEMS)
    if not shown or not handles:
        return
    longest = max(len(name) for _, name in handles)
    column = (longest * 0.6 + 3) * options.font_size  # a label's width, its colour box and the gap
    columns = max(1, min(len(handles), int(options.width // column)))
    figure.legend(
        [handle for handle, _ in handles],
        [_text(name) for _, name in handles],
        loc="outside lower center",
        ncols=columns,
        frameon=False,
        labelcolor=options.foreground,
        handlelength=1.0,
    )
