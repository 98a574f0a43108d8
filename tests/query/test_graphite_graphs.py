"""/render's graph formats (PNG, SVG): the options, the pictures drawn, and through a real gateway.

The drawing tests call gateway.query.graphite.drawing directly (what a drawing process runs) and read
the pictures back: PNG with Pillow (matplotlib's dependency), SVG as XML, where each series' line
is the group ``series_<n>`` and its fill ``area_<n>``.
"""

import base64
import datetime
import io
import itertools
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import pytest_twisted
from PIL import Image

from gateway.query.graphite import drawing
from gateway.query.graphite.graph import (
    CONTENT_TYPES,
    PARAMETERS,
    BadGraphOption,
    GraphPool,
    GraphUnavailable,
    parse_graph_options,
)
from gateway.query.graphite.series import TimeSeries
from tests.e2e.test_fuzz import HOSTILE_TEXT
from tests.graphiteweb import render_batch

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG = "{http://www.w3.org/2000/svg}"
START = 1_700_000_000
STEP = 60


def options(form: str = "png", **params):
    return parse_graph_options(form, lambda name: params.get(name), datetime.UTC)


def series(name: str = "a.b.c", values=None, **graph_options) -> TimeSeries:
    values = [float(i % 10) for i in range(60)] if values is None else values
    made = TimeSeries(name, START, START + STEP * len(values), STEP, values)
    made.options.update(graph_options)
    return made


def png_size(body: bytes) -> tuple[int, int]:
    assert body.startswith(PNG_SIGNATURE)
    return Image.open(io.BytesIO(body)).size


def svg(*series_list, **params) -> ET.Element:
    return ET.fromstring(drawing.draw(options("svg", **params), list(series_list)))


def groups(root: ET.Element, prefix: str) -> dict[str, ET.Element]:
    return {g.get("id"): g for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith(prefix)}


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def path_of(root: ET.Element, group_id: str) -> ET.Element:
    (path,) = groups(root, group_id)[group_id].iter(f"{SVG}path")
    return path


def test_png_has_the_signature_and_the_size_asked():
    assert png_size(drawing.draw(options(width="500", height="200"), [series()])) == (500, 200)


def test_the_default_size_is_graphite_webs():
    assert png_size(drawing.draw(options(), [series(), series("a.b.d")])) == (330, 250)


def test_svg_holds_the_title_and_a_path_per_series():
    root = svg(series("a.b.c"), series("a.b.d"), series("a.b.e"), title="CPU of web1", width="400", height="300")
    assert root.get("width") == "400px" and root.get("height") == "300px"
    assert "CPU of web1" in texts(root)
    lines = groups(root, "series_")
    assert sorted(lines) == ["series_0", "series_1", "series_2"]
    assert all(len(list(g.iter(f"{SVG}path"))) == 1 for g in lines.values())
    assert {"a.b.c", "a.b.d", "a.b.e"} <= set(texts(root))  # the legend


def test_color_list_colours_the_series_in_order():
    root = svg(series("a"), series("b"), series("c"), colorList="ff0000,%2300ff00")
    assert "#ff0000" in path_of(root, "series_0").get("style")
    assert "#00ff00" in path_of(root, "series_1").get("style")
    assert "#ff0000" in path_of(root, "series_2").get("style")  # the list cycles
    default = svg(series("a"))
    assert "#6464ff" in path_of(default, "series_0").get("style")  # graphite-web's blue


def test_a_colour_set_by_color_wins_over_color_list():
    root = svg(series("a", color="darkgreen"), series("b"), colorList="ff0000")
    assert "#00ff00" in path_of(root, "series_0").get("style")
    assert "#ff0000" in path_of(root, "series_1").get("style")  # the list is not consumed by "a"


def test_line_width_and_the_series_option_set_the_stroke():
    root = svg(series("a"), series("b", lineWidth=4.0), lineWidth="2.5")
    assert "stroke-width: 2.5" in path_of(root, "series_0").get("style")
    assert "stroke-width: 4" in path_of(root, "series_1").get("style")


def test_area_modes_fill_what_they_say():
    two = (series("a"), series("b"))
    assert groups(svg(*two), "area_") == {}
    assert sorted(groups(svg(*two, areaMode="all"), "area_")) == ["area_0", "area_1"]
    assert sorted(groups(svg(*two, areaMode="first"), "area_")) == ["area_0"]
    stacked = svg(*two, areaMode="stacked")
    assert sorted(groups(stacked, "area_")) == ["area_0", "area_1"]
    # stacked: the second line is drawn at the sum of both, so higher up than unstacked
    assert path_of(stacked, "series_1").get("d") != path_of(svg(*two), "series_1").get("d")


def test_line_modes_and_null_drawing_change_the_line():
    gappy = [None if i % 10 == 5 else float(i % 7) for i in range(60)]

    def moves(**params) -> int:
        return path_of(svg(series("a", gappy), **params), "series_0").get("d").count("M")

    assert moves() > 1  # slope: a gap at each null
    assert moves(lineMode="connected") == 1
    assert moves(drawNullAsZero="true") == 1
    slope = path_of(svg(series("a"), lineMode="slope"), "series_0").get("d")
    staircase = path_of(svg(series("a"), lineMode="staircase"), "series_0").get("d")
    assert staircase.count("L") > slope.count("L")  # a step is two segments


def test_y_min_and_y_max_set_the_axis():
    assert "1k" not in texts(svg(series()))
    assert "1k" in texts(svg(series(), yMax="1000"))
    assert any(text.endswith("50") and text[0] in "-\u2212" for text in texts(svg(series(), yMin="-50")))


def test_hiding_the_legend_axes_and_everything_but_the_graph():
    many = [series(f"s{i}") for i in range(11)]
    assert "s0" not in texts(svg(*many))  # more than 10 series: no legend, as graphite-web
    assert "s0" in texts(svg(*many, hideLegend="false"))
    assert "a.b.c" not in texts(svg(series(), hideLegend="true"))
    assert not any(text.isdigit() for text in texts(svg(series(), hideAxes="true")))
    assert texts(svg(series(), title="T", vtitle="V", graphOnly="true")) == []


def test_bgcolor_and_fgcolor_paint_the_picture():
    body = drawing.draw(options(bgcolor="black", fgcolor="ff8000", title="T"), [series()])
    picture = Image.open(io.BytesIO(body)).convert("RGB")
    assert picture.getpixel((0, 0)) == (0, 0, 0)
    assert (255, 128, 0) in {colour for _, colour in picture.getcolors(1 << 16)}
    assert "#ff8000" in ET.tostring(svg(series(), fgcolor="ff8000", title="T"), encoding="unicode")


def test_no_series_draws_no_data():
    assert "No Data" in texts(svg())
    assert png_size(drawing.draw(options(), [])) == (330, 250)


def test_series_options_from_render_functions_are_drawn():
    root = svg(
        series("lower", stacked=True, invisible=True),
        series("upper", stacked=True),
        series("deploys", [0.0] * 30 + [1.0] + [0.0] * 29, drawAsInfinite=True),
        series("right", secondYAxis=True),
        series("dashes", dashed=5),
    )
    lines = groups(root, "series_")
    assert "series_0" not in lines  # areaBetween's lower bound is not drawn
    assert sorted(groups(root, "area_")) == ["area_1"]
    assert {"series_1", "series_2", "series_3", "series_4"} <= set(lines)
    assert "stroke-dasharray" in path_of(root, "series_4").get("style")


def test_area_alpha_sets_the_fills_opacity():
    root = svg(series("a"), areaMode="all", areaAlpha="0.25")
    (fill,) = groups(root, "area_0")["area_0"].iter(f"{SVG}use")
    assert fill.get("style") == "fill: #6464ff; fill-opacity: 0.25"


def test_series_options_out_of_range_are_drawn_within_it():
    root = svg(
        series("a", alpha=5.0, lineWidth=-3.0),
        series("b", alpha=float("nan"), dashed=-1),
        series("c", lineWidth=1e9, dashed=float("inf")),
    )
    assert sorted(groups(root, "series_")) == ["series_0", "series_1", "series_2"]
    assert "stroke-width: 100" in path_of(root, "series_2").get("style")


def test_a_title_with_dollars_is_text():
    assert "costs $5 and $6" in texts(svg(series(), title="costs $5 and $6"))


@pytest.mark.parametrize(
    "params, field",
    [
        ({"width": "wide"}, "width"),
        ({"width": "0"}, "width"),
        ({"height": "-5"}, "height"),
        ({"width": "10000", "height": "10000"}, "width"),
        ({"colorList": "red,notacolour"}, "colorList"),
        ({"bgcolor": "12345"}, "bgcolor"),
        ({"fgcolor": "#12345g"}, "fgcolor"),
        ({"areaMode": "sideways"}, "areaMode"),
        ({"lineMode": "curvy"}, "lineMode"),
        ({"lineWidth": "nan"}, "lineWidth"),
        ({"lineWidth": "1000"}, "lineWidth"),
        ({"yMin": "inf"}, "yMin"),
        ({"yMin": "5", "yMax": "5"}, "yMin"),
        ({"hideLegend": "maybe"}, "hideLegend"),
        ({"graphOnly": "2"}, "graphOnly"),
        ({"drawNullAsZero": "yes please"}, "drawNullAsZero"),
    ],
)
def test_bad_options_name_the_parameter(params, field):
    with pytest.raises(BadGraphOption) as raised:
        options(**params)
    assert raised.value.field == field


def test_hostile_values_are_refused_by_name_or_drawn():
    for name in PARAMETERS:
        for value in HOSTILE_TEXT:
            try:
                options("png", **{name: value})
            except BadGraphOption as error:
                assert error.field == name, (name, value)
    hostile = [series(text) for text in HOSTILE_TEXT if text]
    root = svg(*hostile, title="".join(HOSTILE_TEXT), vtitle=HOSTILE_TEXT[-1], hideLegend="false")
    assert len(groups(root, "series_")) == len(hostile)


def test_empty_and_default_values_mean_the_default():
    assert options(width="", height="default", areaMode="", colorList="default") == options()


@pytest_twisted.ensureDeferred
async def test_a_drawing_over_its_deadline_is_stopped_and_the_next_graph_is_drawn():
    pool = GraphPool(processes=1, timeout_s=0.3)  # shorter than starting a drawing process
    try:
        with pytest.raises(GraphUnavailable, match="more than 0.3 s"):
            await pool.draw(options(), [series()])
        pool.timeout_s = 120
        assert png_size(await pool.draw(options(width="200", height="100"), [series()])) == (200, 100)
    finally:
        pool.close()


# -- through a real gateway ------------------------------------------------------------------------


def put_points(gateway, metric: str, count: int) -> int:
    now = int(time.time()) // STEP * STEP
    items = [{"metric": metric, "timestamp": now - STEP * i, "value": float(i % 10), "tags": {}} for i in range(count)]
    assert gateway.post("/api/put", items).status == 200
    return now


def render(gateway, **params):
    return gateway.get("/render?" + urllib.parse.urlencode(params, doseq=True), timeout=60)


def test_render_draws_png_by_default_and_svg_through_a_gateway(start_gateway):
    gateway = start_gateway()
    put_points(gateway, "web.cpu", 60)
    answer = render(gateway, target="web.cpu", **{"from": "-1h"})
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"] == "image/png"
    assert png_size(answer.body) == (330, 250)
    answer = render(gateway, target="web.cpu", format="png", width=640, height=480, **{"from": "-1h"})
    assert png_size(answer.body) == (640, 480)
    answer = render(gateway, target=["web.cpu", "color(web.cpu, 'red')"], format="svg", title="web", **{"from": "-2h"})
    assert answer.status == 200 and answer.headers["Content-Type"] == "image/svg+xml"
    root = ET.fromstring(answer.body)
    assert "web" in texts(root) and sorted(groups(root, "series_")) == ["series_0", "series_1"]
    assert "#c80032" in path_of(root, "series_1").get("style")  # graphite-web's red
    for params, field in [
        ({"areaMode": "sideways"}, "areaMode"),
        ({"width": "99999"}, "width"),
        ({"target": "color(web.cpu, 'nocolour')"}, "target"),
        ({"format": "gif"}, "format"),
    ]:
        answer = render(gateway, **{"target": "web.cpu", "from": "-1h", **params})
        assert answer.status == 400, (params, answer.body)
        assert answer.json()["field"] == field
    assert render(gateway, target="web.cpu", format="json", **{"from": "-1h"}).json()[0]["target"] == "web.cpu"


def test_huge_values_are_drawn_in_png_and_svg(start_gateway):
    """threshold(1e308), or a stored 1e308, was a 500 (matplotlib's ticks overflowed): values and
    yMin/yMax past ±1e300 are drawn at it."""
    gateway = start_gateway()
    now = int(time.time()) // STEP * STEP
    items = [
        {"metric": "huge", "timestamp": now - STEP * i, "value": (-1) ** i * 1.7e308, "tags": {}} for i in range(10)
    ]
    assert gateway.post("/api/put", items).status == 200
    for form, params in itertools.product(
        ("png", "svg"), ({}, {"areaMode": "stacked"}, {"yMin": "-1e308", "yMax": "1e308"})
    ):
        for target in ("threshold(1e308)", "threshold(-1e308)", "huge"):
            answer = render(gateway, target=target, format=form, **{"from": "-1h", **params})
            assert answer.status == 200, (form, target, params, answer.body[:300])
            assert answer.headers["Content-Type"] == CONTENT_TYPES[form]
            if form == "png":
                assert png_size(answer.body) == (330, 250)
            else:
                assert groups(ET.fromstring(answer.body), "series_"), answer.body[:300]


def test_the_gateway_answers_while_a_large_graph_is_drawn(start_gateway):
    """The drawing runs in processes of its own: /healthz does not wait for it."""
    gateway = start_gateway()
    now = int(time.time()) // STEP * STEP
    items = [
        {"metric": f"big.s{j}.cpu", "timestamp": now - STEP * i, "value": float(i * j % 17), "tags": {}}
        for i in range(1440)
        for j in range(20)
    ]
    assert gateway.post("/api/put", items).status == 200
    params = {"target": "big.*.cpu", "from": "-24h", "width": 2000, "height": 1500, "areaMode": "stacked"}
    answers = []
    drawing_thread = threading.Thread(target=lambda: answers.append(render(gateway, **params)))
    started = time.monotonic()
    drawing_thread.start()
    latencies = []
    while drawing_thread.is_alive():
        asked = time.monotonic()
        assert gateway.get("/healthz").status == 200
        latencies.append(time.monotonic() - asked)
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    (answer,) = answers
    assert answer.status == 200 and png_size(answer.body) == (2000, 1500)
    # the drawing overlapped several probes (how many depends on the box's speed, not the outcome)
    assert len(latencies) >= 3 and max(latencies) < 1.0, (elapsed, sorted(latencies)[-5:])


def test_graphite_web_and_tsgate_answer_the_same_image_size(start_gateway, tmp_path: Path):
    gateway = start_gateway()
    now = put_points(gateway, "web.cpu", 60)
    points = [[now - STEP * i, float(i % 10)] for i in range(60)]
    asked = [{}, {"format": "png", "width": "500", "height": "120", "areaMode": "stacked", "title": "cpu"}]
    requests = [{"target": "web.cpu", "from": str(now - 3600), "until": str(now), **params} for params in asked]
    reference = render_batch(tmp_path / "graphite-web", {"web.cpu": points}, requests, step=STEP)
    for request, expected in zip(requests, reference):
        assert expected["status"] == 200 and expected["content_type"] == "image/png", expected["body"][:300]
        ours = render(gateway, **request)
        assert ours.status == 200 and ours.headers["Content-Type"] == "image/png"
        assert png_size(ours.body) == png_size(base64.b64decode(expected["body_base64"]))
