"""The graph formats of /render (``format=png``, ``format=svg``): options and the drawing processes.

graphite-web answers ``/render`` with a PNG when no format is given; its graph parameters
(width, height, title, colorList, areaMode, ...) are parsed and checked here, on the serving
process, so a bad one is a 400 before any data is read. Drawing (``gateway.query.graphite.drawing``,
matplotlib) is CPU work that holds the GIL for a second or more: it runs in a small pool of
processes of its own, never on the reactor's process, and its cost is bounded by the picture's
size (MAX_GRAPH_PIXELS) and by consolidating every series to one point per pixel column.
"""

import concurrent.futures
import ctypes
import dataclasses
import logging
import math
import multiprocessing
import os
import re
import signal
import weakref
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from datetime import tzinfo

from twisted.internet import defer, reactor

from gateway.core.errors import ClientError, Unavailable

log = logging.getLogger(__name__)

CONTENT_TYPES = {"png": "image/png", "svg": "image/svg+xml"}
DEFAULT_WIDTH, DEFAULT_HEIGHT = 330, 250  # graphite-web's
MAX_GRAPH_PIXELS = 4_000_000  # width x height: 2560 x 1560; drawing time grows with it
MAX_GRAPH_SIDE = 10_000
MAX_LINE_WIDTH = 100.0
AREA_MODES = ("none", "first", "all", "stacked")
LINE_MODES = ("slope", "staircase", "connected")
GRAPH_PROCESSES = 2  # drawings at once per gateway process (a drawing uses one core)
DRAW_TIMEOUT_S = 30.0
PR_SET_PDEATHSIG = 1  # Linux prctl(2)

# graphite-web's colour names and their RGB (graphite.render.glyph.colorAliases), so that
# colorList=red draws the red a Graphite user expects.
COLOR_NAMES = {
    "black": (0, 0, 0),
    "white": (255, 255, 255),
    "blue": (100, 100, 255),
    "green": (0, 200, 0),
    "red": (200, 0, 50),
    "yellow": (255, 255, 0),
    "orange": (255, 165, 0),
    "purple": (200, 100, 255),
    "brown": (150, 100, 50),
    "cyan": (0, 255, 255),
    "aqua": (0, 150, 150),
    "gray": (175, 175, 175),
    "grey": (175, 175, 175),
    "magenta": (255, 0, 255),
    "pink": (255, 100, 100),
    "gold": (200, 200, 0),
    "rose": (200, 150, 200),
    "darkblue": (0, 0, 255),
    "darkgreen": (0, 255, 0),
    "darkred": (255, 0, 0),
    "darkgray": (111, 111, 111),
    "darkgrey": (111, 111, 111),
}
# graphite-web's default template (no graphTemplates.conf, as Debian installs it)
DEFAULT_COLORS = "blue,green,red,purple,brown,yellow,aqua,grey,magenta,pink,gold,rose"
_HEX_COLOR = re.compile(r"(?:#|%23)?([0-9a-fA-F]{6}(?:[0-9a-fA-F]{2})?)")

RGBA = tuple[float, float, float, float]


class BadGraphOption(ClientError):
    """A graph parameter the client got wrong; ``field`` names it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.details = {"field": field}


class GraphUnavailable(Unavailable):
    """The drawing process died (killed, out of memory): the request may be retried."""


def parse_color(text: str, field: str) -> RGBA:
    """A graphite-web colour name or ``rrggbb``/``rrggbbaa`` hex (with or without ``#``) as RGBA in 0..1."""
    name = text.strip()
    if name.lower() in COLOR_NAMES:
        red, green, blue = COLOR_NAMES[name.lower()]
        return (red / 255, green / 255, blue / 255, 1.0)
    found = _HEX_COLOR.fullmatch(name)
    if not found:
        raise BadGraphOption(field, f"{text[:40]!r} is not a colour (a name such as red, or hex rrggbb)")
    digits = found.group(1)
    channels = [int(digits[i : i + 2], 16) / 255 for i in range(0, len(digits), 2)]
    return (channels[0], channels[1], channels[2], channels[3] if len(channels) == 4 else 1.0)


@dataclasses.dataclass(frozen=True)
class GraphOptions:
    """What to draw, checked; colours as RGBA. Sent to the drawing process (it pickles)."""

    format: str = "png"
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    title: str = ""
    vtitle: str = ""
    colors: tuple[RGBA, ...] = tuple(parse_color(name, "colorList") for name in DEFAULT_COLORS.split(","))
    background: RGBA = parse_color("white", "bgcolor")
    foreground: RGBA = parse_color("black", "fgcolor")
    major_grid: RGBA = parse_color("rose", "majorGridLineColor")
    minor_grid: RGBA = parse_color("grey", "minorGridLineColor")
    line_width: float = 1.2
    line_mode: str = "slope"
    area_mode: str = "none"
    area_alpha: float | None = None
    y_min: float | None = None
    y_max: float | None = None
    hide_legend: bool | None = None  # None: shown up to LEGEND_MAX_ITEMS series, as graphite-web
    hide_axes: bool = False
    hide_grid: bool = False
    graph_only: bool = False
    draw_null_as_zero: bool = False
    font_size: float = 10.0
    tz: tzinfo | None = None


def _boolean(text: str, field: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise BadGraphOption(field, f"{text[:40]!r} is not true or false")


def _number(text: str, field: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise BadGraphOption(field, f"{text[:40]!r} is not a number") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise BadGraphOption(field, f"{text[:40]} is not between {low:g} and {high:g}")
    return value


def _choice(text: str, field: str, choices: tuple[str, ...]) -> str:
    lowered = text.strip().lower()
    if lowered not in choices:
        raise BadGraphOption(field, f"{text[:40]!r} is not one of {', '.join(choices)}")
    return lowered


def _colors(text: str, name: str) -> tuple[RGBA, ...]:
    return tuple(parse_color(color, name) for color in text.split(","))


def _between(low: float, high: float) -> Callable[[str, str], float]:
    return lambda text, name: _number(text, name, low, high)


# parameter -> (GraphOptions field, parser(text, parameter name) raising BadGraphOption)
PARAMETERS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "width": ("width", lambda text, name: int(_number(text, name, 1, MAX_GRAPH_SIDE))),
    "height": ("height", lambda text, name: int(_number(text, name, 1, MAX_GRAPH_SIDE))),
    "title": ("title", lambda text, name: text),
    "vtitle": ("vtitle", lambda text, name: text),
    "colorList": ("colors", _colors),
    "bgcolor": ("background", parse_color),
    "fgcolor": ("foreground", parse_color),
    "majorGridLineColor": ("major_grid", parse_color),
    "minorGridLineColor": ("minor_grid", parse_color),
    "lineWidth": ("line_width", _between(0.0, MAX_LINE_WIDTH)),
    "areaAlpha": ("area_alpha", _between(0.0, 1.0)),
    "fontSize": ("font_size", _between(1.0, 100.0)),
    "yMin": ("y_min", _between(-math.inf, math.inf)),
    "yMax": ("y_max", _between(-math.inf, math.inf)),
    "lineMode": ("line_mode", lambda text, name: _choice(text, name, LINE_MODES)),
    "areaMode": ("area_mode", lambda text, name: _choice(text, name, AREA_MODES)),
    "hideLegend": ("hide_legend", _boolean),
    "hideAxes": ("hide_axes", _boolean),
    "hideGrid": ("hide_grid", _boolean),
    "graphOnly": ("graph_only", _boolean),
    "drawNullAsZero": ("draw_null_as_zero", _boolean),
}


def parse_graph_options(form: str, get: Callable[[str], str | None], tz: tzinfo) -> GraphOptions:
    """The graph parameters of a /render request (``get(name)`` -> its value or None), checked.

    Empty values and ``default`` mean the default, as in graphite-web.
    """
    found: dict = {"format": form, "tz": tz}
    for name, (field, parse) in PARAMETERS.items():
        text = get(name)
        if text is not None and text.strip() not in ("", "default"):
            found[field] = parse(text, name)
    width, height = found.get("width", DEFAULT_WIDTH), found.get("height", DEFAULT_HEIGHT)
    if width * height > MAX_GRAPH_PIXELS:
        raise BadGraphOption("width", f"{width}x{height} is more than {MAX_GRAPH_PIXELS:,} pixels")
    if found.get("y_min", -math.inf) >= found.get("y_max", math.inf):
        raise BadGraphOption("yMin", f"yMin {found['y_min']:g} is not below yMax {found['y_max']:g}")
    return GraphOptions(**found)


def check_series_colors(series_list) -> None:
    """A colour set by color()/threshold()/verticalLine() that is not a colour is the client's: 400."""
    for series in series_list:
        if "color" in series.options:
            parse_color(str(series.options["color"]), "target")


def _draw(options: GraphOptions, series_list) -> bytes:
    """Runs in a drawing process or a query executor: matplotlib is imported there only, never
    by the serving process."""
    from gateway.query.graphite import drawing

    return drawing.draw(options, series_list)


def _start_drawing_process(gateway_pid: int) -> None:
    """A drawing process leaves Ctrl-C to the gateway, which stops it, and ends when the gateway
    ends, even killed (its queue's pipe stays open in the process itself, so it would wait forever)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != gateway_pid:  # the gateway ended before the line above
        os._exit(0)


class GraphPool:
    """The processes that draw graphs, started on the first graph (spawned: a fork of the
    reactor's process would copy its threads' locks).

    A drawing still running after ``timeout_s`` has its pool's processes killed (the graphs they
    were drawing answer 503) and new ones start with the next graph: a picture never holds a core
    longer than that.
    """

    def __init__(self, processes: int = GRAPH_PROCESSES, timeout_s: float = DRAW_TIMEOUT_S):
        self.processes = processes
        self.timeout_s = timeout_s
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._expired: weakref.WeakSet[concurrent.futures.ProcessPoolExecutor] = weakref.WeakSet()

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(
                self.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_drawing_process,
                initargs=(os.getpid(),),
            )
        return self._executor

    async def draw(self, options: GraphOptions, series_list) -> bytes:
        executor = self._pool()
        deadline = reactor.callLater(self.timeout_s, self._expire, executor)  # type: ignore[arg-type]  # zope interface: see [tool.mypy]
        try:
            return await _deferred(executor.submit(_draw, options, series_list))
        except BrokenProcessPool:
            if executor in self._expired:
                raise GraphUnavailable(f"drawing the graph took more than {self.timeout_s:g} s") from None
            log.warning("a graph drawing process died; starting new ones")
            self._stop(executor)
            raise GraphUnavailable("the graph drawing process died; retry") from None
        finally:
            if deadline.active():  # type: ignore[misc]  # zope interface: see [tool.mypy]
                deadline.cancel()  # type: ignore[misc]  # zope interface: see [tool.mypy]

    def _expire(self, executor: concurrent.futures.ProcessPoolExecutor) -> None:
        log.warning("a graph took more than %g s to draw: its drawing processes are stopped", self.timeout_s)
        self._expired.add(executor)
        self._stop(executor)

    def _stop(self, executor: concurrent.futures.ProcessPoolExecutor) -> None:
        """Kill the pool's processes (a drawing cannot be interrupted otherwise): their futures fail."""
        if self._executor is executor:
            self._executor = None
        processes = list((executor._processes or {}).values())  # no public way before Python 3.14
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()

    def close(self) -> None:
        if self._executor is not None:
            self._stop(self._executor)


class DrawHere:
    """Draws in this process: a query executor (gateway/app/executors.py) is already a process of its
    own, killed at the query deadline, so drawing processes of its own would only add two processes
    per executor."""

    async def draw(self, options: GraphOptions, series_list) -> bytes:
        return _draw(options, series_list)

    def close(self) -> None:
        """Nothing runs beside the process."""


def _deferred(future: concurrent.futures.Future) -> defer.Deferred:
    """A Deferred that fires on the reactor thread with the future's result or failure."""
    result: defer.Deferred = defer.Deferred()

    def fire(done: concurrent.futures.Future) -> None:
        if done.cancelled():
            result.errback(GraphUnavailable("the gateway is stopping"))
            return
        error = done.exception()
        if error is not None:
            result.errback(error)
        else:
            result.callback(done.result())

    future.add_done_callback(lambda done: reactor.callFromThread(fire, done))
    return result
