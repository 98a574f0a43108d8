"""tsgate's /render against graphite-web 1.1.8 itself, target by target.

One data set (11 plain metrics and 3 tagged series, 60 s step, three hours ending at an aligned
``NOW``, with gaps, negative values and counters that reset or wrap) is written into whisper
files of a real graphite-web (Debian's package, run by ``tests/graphiteweb.py`` under
``/usr/bin/python3`` in one subprocess for the whole corpus) and sent to a real tsgate gateway
over the carbon plaintext port. Every case of ``CASES`` is then rendered by both with the same
absolute ``from``/``until`` and ``format=json``, and the answers must agree: the same series in
the same order, the same names and tags, the same timestamps, and values equal within 1e-9
relative (``None`` only equal to ``None``).

Where graphite-web 1.1.8 is itself wrong or the difference is deliberate (documented in
``docs/graphite-functions.rst``), the case is listed in ``KNOWN_DIFFERENCES`` with the reason and a
check of tsgate's own documented answer; such cases are never skipped.
"""

import functools
import json
import math
import random
import re
import socket
import time
import urllib.parse
from typing import NamedTuple

import pytest

from tests.gatewayproc import GatewayProcess
from tests.graphiteweb import render_batch

STEP = 60
# A moment in a case's parameters, relative to the module's ``now`` (see ``Window``): ``@NOW-5400``
# as epoch seconds, ``@HM+3600`` as graphite-web's HH:MM_YYYYMMDD.
_MOMENT = re.compile(r"@(NOW|HM)([-+]\d+)")


class Window(NamedTuple):
    """The module's times: ``now`` aligned, the first point 3 hours before, renders over the last
    2 hours (the hour before feeds moving windows and shifts)."""

    now: int

    @property
    def first(self) -> int:
        return self.now - 3 * 3600

    @property
    def start(self) -> int:
        return self.now - 2 * 3600

    def moment(self, text: str) -> str:
        def absolute(match) -> str:
            at = self.now + int(match.group(2))
            return str(at) if match.group(1) == "NOW" else time.strftime("%H:%M_%Y%m%d", time.gmtime(at))

        return _MOMENT.sub(absolute, text)

    def params(self, request: dict) -> dict:
        """A case's render parameters, its moments made absolute."""
        params = {"format": "json", "from": str(self.start), "until": str(self.now), **request}
        return {
            name: [self.moment(v) for v in value] if isinstance(value, list) else self.moment(value)
            for name, value in params.items()
        }


@functools.cache
def module_window() -> Window:
    """Read from the clock when the module's first test asks (never at import), then fixed."""
    return Window(int(time.time()) // 600 * 600 - 600)


@functools.cache
def module_data() -> dict[str, list]:
    return _data(module_window())


def _data(window: Window) -> dict[str, list]:
    """Deterministic series: ``{name: [[timestamp, value or None], ...]}``, one point per minute."""
    rng = random.Random(20240601)
    times = list(range(window.first, window.now + 1, STEP))
    count = len(times)
    series = {}

    def wave(base, amplitude, noise):
        return [round(base + amplitude * math.sin(i / 9.0) + rng.uniform(-noise, noise), 3) for i in range(count)]

    for host, base in (("web1", 40.0), ("web2", 55.0), ("web3", 20.0), ("db1", 70.0)):
        series[f"servers.{host}.cpu.user"] = wave(base, 25.0, 6.0)
        series[f"servers.{host}.cpu.system"] = wave(base / 4, 5.0, 2.0)
    user2 = series["servers.web2.cpu.user"]
    for i in list(range(30, 34)) + list(range(100, 112)) + [count - 2]:  # gaps, one near the end
        user2[i] = None
    system3 = series["servers.web3.cpu.system"]
    for i in range(60, 80):
        system3[i] = None
    system3[150] = 0.0  # a zero divisor
    user3 = series["servers.web3.cpu.user"]  # dips below zero
    for i in range(120, 140):
        user3[i] = round(user3[i] - 45.0, 3)
    disk, value = [], 5_000_000.0
    for i in range(count):  # a counter that resets once, with a short gap
        value = 1234.0 if i == 97 else value + 1000 + rng.randrange(0, 5000)
        disk.append(None if i in (40, 41, 42) else value)
    series["servers.db1.disk.bytes"] = disk
    packets, value = [], 60000.0
    for _ in range(count):  # wraps at 65535, no gaps
        value = (value + 300 + rng.randrange(0, 200)) % 65536
        packets.append(value)
    series["servers.db1.net.packets"] = packets
    series["servers.web1.requests.count"] = [None if i % 7 == 3 else float(rng.randrange(0, 50)) for i in range(count)]
    for name, base in (
        ("cpu.load;dc=x;host=web1", 1.5),
        ("cpu.load;dc=x;host=web2", 2.5),
        ("cpu.load;dc=y;host=db1", 0.75),
    ):
        series[name] = [round(base + math.cos(i / 13.0) + rng.uniform(-0.3, 0.3), 4) for i in range(count)]
    series["cpu.load;dc=y;host=db1"][55] = None
    return {name: [[t, v] for t, v in zip(times, values)] for name, values in series.items()}


WEB_USER = "servers.web*.cpu.user"
CPU = "servers.*.cpu.*"
LOAD = "seriesByTag('name=cpu.load')"


def case(target, **params):
    """One render request: a target (or a list of them) and extra parameters."""
    return {"target": target, **params}


CASES = {
    # Combine
    "sumSeries": case(f"sumSeries({WEB_USER})"),
    "sumSeries-two-lists": case("sumSeries(servers.web1.cpu.*,servers.db1.cpu.user)"),
    "averageSeries": case("averageSeries(servers.*.cpu.system)"),
    "maxSeries": case("maxSeries(servers.web*.cpu.*)"),
    "minSeries": case(f"minSeries({WEB_USER})"),
    "diffSeries-two": case("diffSeries(servers.web1.cpu.user,servers.web2.cpu.user)"),
    "diffSeries-wildcard": case(f"diffSeries({WEB_USER})"),
    "divideSeries": case("divideSeries(servers.web1.cpu.user,servers.web2.cpu.user)"),
    "divideSeries-zero-divisor": case(f"divideSeries({WEB_USER},servers.web3.cpu.system)"),
    "multiplySeries": case("multiplySeries(servers.web1.cpu.*)"),
    "asPercent-total-of-list": case(f"asPercent({WEB_USER})"),
    "asPercent-series-total": case("asPercent(servers.web2.cpu.user,servers.web1.cpu.user)"),
    "asPercent-constant": case(f"asPercent({WEB_USER},200)"),
    "asPercent-nodes": case(f"asPercent({CPU},None,1)"),
    "countSeries": case("countSeries(servers.web*.cpu.*)"),
    "countSeries-tags": case(f"countSeries({LOAD})"),
    "sumSeries-tagged": case(f"sumSeries({LOAD})"),
    "maxSeries-nothing": case("maxSeries(servers.nothing.*)"),
    # Alias
    "alias": case('alias(servers.web1.cpu.user,"Web One")'),
    "aliasByNode": case(f"aliasByNode({CPU},1,3)"),
    "aliasByNode-negative": case(f"aliasByNode({WEB_USER},-1)"),
    "aliasByNode-of-function": case(f"aliasByNode(movingAverage({WEB_USER},3),1)"),
    "aliasByMetric": case(f"aliasByMetric({WEB_USER})"),
    "aliasByMetric-of-function": case("aliasByMetric(scale(servers.web1.cpu.user,2))"),
    "aliasSub": case(r'aliasSub(servers.web*.cpu.user,"servers\.(\w+)\.cpu","\1-cpu")'),
    "aliasByTags": case(f"aliasByTags({LOAD},'host','dc')"),
    "aliasByTags-node": case(f"aliasByTags({LOAD},'dc',1)"),
    "grafana-aliasSub": case(rf'aliasSub(sumSeries({WEB_USER}),"(^.*$)","\1 A")'),
    "grafana-aliasSub-tags": case(rf'aliasSub({LOAD},"(^.*$)","\1 A")'),
    "grafana-aliasSub-path": case(r'aliasSub(servers.web1.cpu.user,"(^.*$)","\1 A")'),
    # Transform
    "scale": case("scale(servers.web1.cpu.user,2.5)"),
    "scale-tags": case(f"scale({LOAD},2)"),
    "scaleToSeconds": case("scaleToSeconds(servers.db1.disk.bytes,1)"),
    "offset": case("offset(servers.web3.cpu.user,-10)"),
    "absolute": case("absolute(servers.web3.cpu.user)"),
    "perSecond": case("perSecond(servers.db1.disk.bytes)"),
    "perSecond-maxValue": case("perSecond(servers.db1.net.packets,65535)"),
    "derivative": case("derivative(servers.db1.disk.bytes)"),
    "nonNegativeDerivative": case("nonNegativeDerivative(servers.db1.disk.bytes)"),
    "nonNegativeDerivative-maxValue": case("nonNegativeDerivative(servers.db1.net.packets,65535)"),
    "integral": case("integral(servers.web2.cpu.user)"),
    "movingAverage-points": case("movingAverage(servers.web1.cpu.user,5)"),
    "movingAverage-interval": case("movingAverage(servers.web2.cpu.user,'10min')"),
    "movingAverage-xff": case("movingAverage(servers.web2.cpu.user,'5min',0.5)"),
    "movingAverage-tags": case(f"movingAverage({LOAD},4)"),
    "summarize": case("summarize(servers.web1.cpu.user,'10min')"),
    "summarize-max": case("summarize(servers.web2.cpu.user,'15min','max')"),
    "summarize-alignToFrom": case("summarize(servers.db1.disk.bytes,'1h','last',true)"),
    "summarize-avg-7min": case("summarize(servers.web3.cpu.system,'7min','avg')"),
    "hitcount": case("hitcount(servers.web1.requests.count,'5min')"),
    "hitcount-aligned": case("hitcount(servers.web1.requests.count,'10min',true)"),
    "timeShift": case("timeShift(servers.web1.cpu.user,'30min')"),
    "timeShift-forward": case("timeShift(servers.web1.cpu.user,'-10min')"),
    "timeShift-tags": case(f"timeShift({LOAD},'1h')"),
    "delay": case("delay(servers.web2.cpu.user,3)"),
    "keepLastValue": case("keepLastValue(servers.web2.cpu.user)"),
    "keepLastValue-limit": case("keepLastValue(servers.web3.cpu.system,2)"),
    "transformNull": case("transformNull(servers.web2.cpu.user,-1)"),
    "transformNull-reference": case("transformNull(servers.web2.cpu.user,0,servers.web3.cpu.system)"),
    "transformNull-nothing": case("transformNull(servers.nothing.*)"),
    "removeAboveValue": case("removeAboveValue(servers.web1.cpu.user,50)"),
    "removeBelowValue": case("removeBelowValue(servers.web3.cpu.user,0)"),
    # Filter series
    "highestCurrent": case("highestCurrent(servers.*.cpu.user,2)"),
    "highestMax": case(f"highestMax({CPU},3)"),
    "highestAverage": case(f"highestAverage({WEB_USER},1)"),
    "highestMax-tags": case(f"highestMax({LOAD},1)"),
    "lowestCurrent": case("lowestCurrent(servers.*.cpu.system,2)"),
    "lowestAverage": case(f"lowestAverage({CPU},2)"),
    "limit": case(f"limit({CPU},3)"),
    "exclude": case(f"exclude({CPU},'web2')"),
    "grep": case(f"grep({CPU},'system')"),
    "currentAbove": case("currentAbove(servers.*.cpu.user,40)"),
    "currentBelow": case(f"currentBelow({CPU},40)"),
    "averageAbove": case(f"averageAbove({CPU},30)"),
    "maximumAbove": case(f"maximumAbove({CPU},80)"),
    # Sorting
    "sortByName": case(f"sortByName(aliasByNode({CPU},3,1))"),
    "sortByName-reverse": case("sortByName(servers.*.cpu.user,false,true)"),
    "sortByMaxima": case(f"sortByMaxima({CPU})"),
    # Grouping
    "groupByNode": case("groupByNode(servers.*.cpu.user,1,'sumSeries')"),
    "groupByNode-max": case(f"groupByNode({CPU},3,'max')"),
    "groupByNode-default": case(f"groupByNode({CPU},1)"),
    "groupByNodes": case(f"groupByNodes({CPU},'average',3)"),
    "groupByNodes-two": case(f"groupByNodes({CPU},'sum',1,3)"),
    "groupByTags": case(f"groupByTags({LOAD},'sum','dc')"),
    "groupByTags-name": case(f"groupByTags({LOAD},'max','name')"),
    "sumSeriesWithWildcards": case(f"sumSeriesWithWildcards({CPU},1)"),
    "averageSeriesWithWildcards": case(f"averageSeriesWithWildcards({CPU},1,3)"),
    "applyByNode": case("applyByNode(servers.*.cpu.user,1,'sumSeries(%.cpu.*)')"),
    "applyByNode-newName": case(
        "applyByNode(servers.web*.cpu.user,1,'divideSeries(%.cpu.user,%.cpu.system)','%.ratio')"
    ),
    # Percentiles
    "nPercentile": case("nPercentile(servers.web1.cpu.user,95)"),
    "nPercentile-gaps": case("nPercentile(servers.web2.cpu.user,50)"),
    "percentileOfSeries": case(f"percentileOfSeries({WEB_USER},90)"),
    "percentileOfSeries-interpolate": case(f"percentileOfSeries({WEB_USER},50,true)"),
    # Special and graph
    "constantLine": case("constantLine(42)"),
    "threshold": case("threshold(75,'warn','red')"),
    "seriesByTag": case("seriesByTag('name=cpu.load','dc=x')"),
    "seriesByTag-regex": case("seriesByTag('host=~web.*')"),
    "seriesByTag-not": case("seriesByTag('name=cpu.load','host!=web2')"),
    "color": case("color(servers.web1.cpu.user,'red')"),
    "lineWidth": case("lineWidth(servers.web1.cpu.user,3)"),
    "dashed": case("dashed(servers.web1.cpu.user)"),
    "stacked": case(f"stacked({WEB_USER})"),
    "consolidateBy": case("consolidateBy(servers.web1.cpu.user,'max')"),
    # maxDataPoints consolidation (format=json only)
    "maxDataPoints": case("servers.web1.cpu.user", maxDataPoints="20"),
    "maxDataPoints-consolidateBy-max": case("consolidateBy(servers.web2.cpu.user,'max')", maxDataPoints="17"),
    "maxDataPoints-consolidateBy-sum": case("consolidateBy(servers.web2.cpu.user,'sum')", maxDataPoints="50"),
    "maxDataPoints-consolidateBy-min": case("consolidateBy(servers.web3.cpu.system,'min')", maxDataPoints="30"),
    "maxDataPoints-consolidateBy-first-last": case(
        [
            "consolidateBy(servers.web2.cpu.user,'first')",
            "consolidateBy(servers.web2.cpu.user,'last')",
            "summarize(servers.web1.cpu.user,'5min')",
        ],
        maxDataPoints="11",
    ),
    "maxDataPoints-one": case("servers.web1.cpu.system", maxDataPoints="1"),
    "maxDataPoints-tags": case(f"consolidateBy({LOAD},'max')", maxDataPoints="25"),
    # edges: more arguments, gaps at the ends of windows, tags through functions
    "sumSeries-one": case("sumSeries(servers.web1.cpu.user)"),
    "asPercent-pairwise": case("asPercent(servers.web*.cpu.user,servers.web*.cpu.system)"),
    "asPercent-total-nodes": case(f"asPercent({CPU},servers.*.cpu.user,1)"),
    "divideSeries-aggregate": case(f"divideSeries(servers.web2.cpu.user,sumSeries({WEB_USER}))"),
    "countSeries-nothing": case("countSeries(servers.nothing.*)"),
    "aggregate-median": case(f"aggregate({CPU},'median')"),
    "aggregate-stddev-xff": case(f"aggregate({WEB_USER},'stddev',0.9)"),
    "aliasByNode-tagged": case(f"aliasByNode({LOAD},1)"),
    "aliasByMetric-tagged": case(f"aliasByMetric({LOAD})"),
    "aliasByTags-missing": case(f"aliasByTags(sumSeries({LOAD}),'dc','name')"),
    "aliasSub-g": case(r"aliasSub(servers.*.cpu.system,'^servers\\.([^.]+)\\..*','\\g<1> sys')"),
    "offset-tags": case(f"offset({LOAD},1.5)"),
    "perSecond-tags": case(f"perSecond({LOAD})"),
    "derivative-tags": case(f"derivative({LOAD})"),
    "integral-tags": case(f"integral({LOAD})"),
    "absolute-tags": case(f"absolute(offset({LOAD},-2))"),
    "removeAboveValue-tags": case(f"removeAboveValue({LOAD},2)"),
    "keepLastValue-tags": case(f"keepLastValue({LOAD})"),
    "nonNegativeDerivative-minValue": case("nonNegativeDerivative(servers.db1.net.packets,minValue=0)"),
    "scaleToSeconds-half": case("scaleToSeconds(servers.web1.requests.count,0.5)"),
    "movingAverage-points-gaps": case("movingAverage(servers.web2.cpu.user,10)"),
    "movingAverage-longer-than-data": case("movingAverage(servers.web1.cpu.user,'2h')"),
    "movingAverage-of-sum": case(f"movingAverage(sumSeries({WEB_USER}),'15min')"),
    "movingMax": case("movingMax(servers.web2.cpu.user,'7min')"),
    "movingSum": case("movingSum(servers.web2.cpu.user,6)"),
    "movingMin-tags": case(f"movingMin({LOAD},'5min')"),
    "summarize-median": case("summarize(servers.web2.cpu.user,'20min','median')"),
    "summarize-count": case("summarize(servers.web2.cpu.user,'10min','count')"),
    "summarize-range-alignToFrom": case("summarize(servers.web3.cpu.user,'25min','range',true)"),
    "summarize-last-1h": case("summarize(servers.db1.disk.bytes,'1h','last')"),
    "summarize-tags": case(f"summarize({LOAD},'30min','max')"),
    "hitcount-gaps": case("hitcount(servers.web2.cpu.user,'7min')"),
    "hitcount-tags": case(f"hitcount({LOAD},'1h',true)"),
    "timeShift-out-of-data": case("timeShift(servers.web1.cpu.user,'6h')"),
    "timeShift-no-resetEnd": case("timeShift(servers.web1.cpu.user,'1h',false)"),
    "delay-tags": case(f"delay({LOAD},2)"),
    "transformNull-float": case("transformNull(servers.web3.cpu.system,2.5)"),
    "highestCurrent-gaps": case(f"highestCurrent({CPU},3)"),
    "lowestCurrent-user": case("lowestCurrent(servers.*.cpu.user,1)"),
    "highestAverage-tags": case(f"highestAverage({LOAD},2)"),
    "lowestAverage-tags": case(f"lowestAverage({LOAD},1)"),
    "exclude-regex": case(f"exclude({CPU},'^servers\\.web[12]')"),
    "grep-tags": case(f"grep({LOAD},'dc=y')"),
    "limit-more": case("limit(servers.web1.cpu.*,10)"),
    "sortByMaxima-tags": case(f"sortByMaxima({LOAD})"),
    "sortByName-natural": case("sortByName(aliasByNode(servers.*.cpu.user,1),true)"),
    "averageBelow": case(f"averageBelow({CPU},20)"),
    "maximumBelow": case(f"maximumBelow({CPU},30)"),
    "minimumAbove": case(f"minimumAbove({CPU},10)"),
    "groupByNode-median": case(f"groupByNode({CPU},1,'median')"),
    "groupByNode-diff": case(f"groupByNode({CPU},1,'diff')"),
    "groupByNode-count": case(f"groupByNode({CPU},3,'count')"),
    "groupByNode-range": case(f"groupByNode({CPU},3,'range')"),
    "groupByNode-multiply": case(f"groupByNode({CPU},1,'multiply')"),
    "groupByNodes-none": case(f"groupByNodes({CPU},'sum')"),
    "groupByTags-two": case(f"groupByTags({LOAD},'average','dc','name')"),
    "groupByTags-missing-tag": case(f"groupByTags({LOAD},'sum','rack')"),
    "groupByNode-tagged": case(f"groupByNode({LOAD},0,'sum')"),
    "sumSeriesWithWildcards-two": case(f"sumSeriesWithWildcards({CPU},1,3)"),
    "averageSeriesWithWildcards-node": case("averageSeriesWithWildcards(servers.web*.cpu.*,1)"),
    "applyByNode-node0": case("applyByNode(servers.web*.cpu.user,0,'maxSeries(%.*.cpu.user)')"),
    "nPercentile-tags": case(f"nPercentile({LOAD},10)"),
    "percentileOfSeries-gaps": case("percentileOfSeries(servers.web2.cpu.*,75)"),
    "percentileOfSeries-tags": case(f"percentileOfSeries({LOAD},50)"),
    "legendValue": case("legendValue(servers.web1.cpu.user,'avg','last','max')"),
    "legendValue-si": case("legendValue(servers.db1.disk.bytes,'last','si')"),
    "cactiStyle": case("cactiStyle(servers.db1.disk.bytes)"),
    "cactiStyle-binary": case(f"cactiStyle({WEB_USER},'binary','b')"),
    "seriesByTag-regex-unanchored": case("seriesByTag('host=~eb')"),
    "seriesByTag-not-regex": case("seriesByTag('name=cpu.load','host!=~web')"),
    "seriesByTag-empty-tag": case("seriesByTag('name=cpu.load','rack=')"),
    "color-tags": case(f"color({LOAD},'blue')"),
    "stacked-gaps": case("stacked(servers.web2.cpu.*,'stackA')"),
    "consolidateBy-avg_zero": case("consolidateBy(servers.web2.cpu.user,'avg_zero')", maxDataPoints="13"),
    "maxDataPoints-moving": case(f"movingAverage({WEB_USER},'10min')", maxDataPoints="7"),
    "maxDataPoints-constant": case(["constantLine(3)", "threshold(5)"], maxDataPoints="2"),
    "maxDataPoints-more-than-points": case("servers.web1.cpu.user", maxDataPoints="500"),
    "maxDataPoints-summarize": case("summarize(servers.web2.cpu.user,'5min','sum')", maxDataPoints="9"),
    "maxDataPoints-mixed": case(
        ["servers.web2.cpu.user", f"timeShift({WEB_USER},'15min')", "constantLine(1)"], maxDataPoints="31"
    ),
    "xFilesFactor-request": case("averageSeries(servers.web2.cpu.user,servers.web3.cpu.system)", xFilesFactor="0.6"),
    "noNullPoints": case("servers.web2.cpu.user", noNullPoints="true"),
    # the rest of the library, one typical call each
    "aggregateWithWildcards": case(f"aggregateWithWildcards({CPU},'max',1)"),
    "aggregateSeriesLists": case("aggregateSeriesLists(servers.web*.cpu.user,servers.web*.cpu.system,'diff')"),
    "sumSeriesLists": case("sumSeriesLists(servers.web*.cpu.user,servers.web*.cpu.system)"),
    "diffSeriesLists": case("diffSeriesLists(servers.web*.cpu.user,servers.web*.cpu.system)"),
    "multiplySeriesLists": case("multiplySeriesLists(servers.web*.cpu.user,servers.web*.cpu.system)"),
    "divideSeriesLists": case("divideSeriesLists(servers.web*.cpu.user,servers.web*.cpu.system)"),
    "multiplySeriesWithWildcards": case(f"multiplySeriesWithWildcards({CPU},3)"),
    "rangeOfSeries": case(f"rangeOfSeries({WEB_USER})"),
    "stddevSeries": case(f"stddevSeries({WEB_USER})"),
    "powSeries": case("powSeries(servers.web1.cpu.system,servers.web2.cpu.system)"),
    "weightedAverage": case("weightedAverage(servers.*.cpu.user,servers.*.cpu.system,1)"),
    "group": case("group(servers.web2.cpu.user,servers.web1.cpu.user)"),
    "mapSeries-reduceSeries": case(f"reduceSeries(mapSeries({CPU},1),'asPercent',3,'user','system')"),
    "mapSeries-reduceSeries-diffSeries": case(f"reduceSeries(mapSeries({CPU},1),'diffSeries',3,'user','system')"),
    "mapSeries-reduceSeries-divideSeries": case(f"reduce(map({CPU},1),'divideSeries',3,'system','user')"),
    "mapSeries-no-nodes": case(f"reduceSeries(mapSeries({WEB_USER}),'sumSeries',1,'web1','web3')"),
    "reduceSeries-no-matchers": case(f"reduceSeries(mapSeries({CPU},1),'sumSeries',3)"),
    "reduceSeries-missing-matcher": case("reduceSeries(mapSeries(servers.*.*.*,1),'diffSeries',3,'user','bytes')"),
    "reduceSeries-node-out-of-range": case(
        "reduceSeries(mapSeries(time('t',60),99999999999999999999),'sumSeries',1,'t')"
    ),
    "add": case("add(servers.web1.cpu.user,-2.5)"),
    "exp": case("exp(scale(servers.web1.cpu.system,0.1))"),
    "log": case("log(servers.web3.cpu.user,10)"),
    "logit": case("logit(scale(servers.web1.cpu.user,0.01))"),
    "sigmoid": case("sigmoid(scale(servers.web1.cpu.user,0.1))"),
    "pow": case("pow(servers.web3.cpu.user,2)"),
    "squareRoot": case("squareRoot(servers.web3.cpu.user)"),
    "invert": case("invert(servers.web3.cpu.system)"),
    "round": case("round(servers.web1.cpu.user,1)"),
    "round-negative": case("round(servers.db1.disk.bytes,-3)"),
    "offsetToZero": case("offsetToZero(servers.web3.cpu.user)"),
    "minMax": case("minMax(servers.web2.cpu.user)"),
    "isNonNull": case("isNonNull(servers.web2.cpu.*)"),
    "interpolate": case("interpolate(servers.web2.cpu.user)"),
    "interpolate-limit": case("interpolate(servers.web3.cpu.system,5)"),
    "integralByInterval": case("integralByInterval(servers.web1.requests.count,'30min')"),
    "smartSummarize": case("smartSummarize(servers.web1.cpu.user,'15min','max')"),
    "timeSlice": case("timeSlice(servers.web1.cpu.user,'@NOW-5400','@NOW-3600')"),
    "timeStack": case("timeStack(servers.web1.cpu.user,'20min',0,3)"),
    "changed": case("changed(servers.web1.requests.count)"),
    "cumulative": case("cumulative(servers.web1.cpu.user)", maxDataPoints="10"),
    "exponentialMovingAverage": case("exponentialMovingAverage(servers.web2.cpu.user,5)"),
    "movingMedian": case("movingMedian(servers.web2.cpu.user,'5min')"),
    "movingWindow": case("movingWindow(servers.web2.cpu.user,4,'avg_zero')"),
    "linearRegression": case("linearRegression(servers.db1.disk.bytes)"),
    "stdev": case("stdev(servers.web2.cpu.user,5)"),
    "aggregateLine": case("aggregateLine(servers.web2.cpu.user,'max')"),
    "identity": case("identity('the.time')"),
    "averageOutsidePercentile": case(f"averageOutsidePercentile({CPU},80)"),
    "removeBetweenPercentile": case(
        "removeBetweenPercentile(group(servers.{web1,db1}.cpu.*,servers.web3.cpu.user),90)"
    ),
    "removeBetweenPercentile-gaps": case(f"removeBetweenPercentile({CPU},90)"),
    "removeAbovePercentile": case("removeAbovePercentile(servers.web2.cpu.user,80)"),
    "removeBelowPercentile": case("removeBelowPercentile(servers.web2.cpu.user,20)"),
    "mostDeviant": case(f"mostDeviant({CPU},2)"),
    "highest": case(f"highest({CPU},2,'sum')"),
    "highest-defaults": case(f"highest({CPU})"),
    "lowest-defaults": case(f"lowest({CPU})"),
    "highest-func-keyword": case(f"highest({CPU},func='max')"),
    "sumSeries-no-arguments": case("sumSeries()"),
    "averageSeries-no-arguments": case("averageSeries()"),
    "aliasByNode-no-nodes": case(f"aliasByNode({WEB_USER})"),
    "sortByName-natural-long-number": case(f"sortByName(aliasSub({WEB_USER},'web','{'9' * 5000}'),true)"),
    "lowest": case(f"lowest({CPU},2,'last')"),
    "filterSeries": case(f"filterSeries({CPU},'max','>',60)"),
    "useSeriesAbove": case("useSeriesAbove(servers.{web1,web3,db1}.cpu.user,60,'user','system')"),
    "useSeriesAbove-gaps": case("useSeriesAbove(servers.*.cpu.user,60,'user','system')"),
    "unique": case("unique(servers.web1.cpu.user,servers.web1.cpu.*)"),
    "removeEmptySeries": case("removeEmptySeries(servers.web*.cpu.user,0.95)"),
    "sortBy": case(f"sortBy({CPU},'stddev',true)"),
    "sortByMinima": case(f"sortByMinima({CPU})"),
    "sortByTotal": case(f"sortByTotal({CPU})"),
    "aliasQuery": case(
        r"aliasQuery(servers.web1.cpu.user,'servers\\.web1\\.cpu\\.(\\w+)','servers.web1.cpu.\\1','%d load')"
    ),
    "alpha-secondYAxis": case("secondYAxis(alpha(servers.web1.cpu.user,0.5))"),
    "areaBetween": case("areaBetween(servers.web1.cpu.*)"),
    "drawAsInfinite": case("drawAsInfinite(servers.web1.requests.count)"),
    "verticalLine": case("verticalLine('@NOW-3600','deploy','green')"),
    "fallbackSeries": case("fallbackSeries(servers.nothing.*,constantLine(7))"),
    "setXFilesFactor": case("averageSeries(setXFilesFactor(servers.web2.cpu.user,0.5),servers.web3.cpu.system)"),
    "xFilesFactor-summarize": case("summarize(xFilesFactor(servers.web2.cpu.user,0.9),'10min')"),
    "substr": case("substr(servers.web1.cpu.user,1,3)"),
    "changed-tags": case(f"changed({LOAD})"),
    "pct-alias": case(f"pct({WEB_USER})"),
    "avg-sum-alias": case(f"sum(avg({WEB_USER}),servers.db1.cpu.user)"),
    # the grammar, globs, keyword arguments and time formats
    "glob-brackets": case("servers.web[12].cpu.user"),
    "glob-question-braces": case("servers.web?.cpu.{user,system}"),
    "glob-partial": case("servers.*1.cpu.sys*"),
    "keyword-args": case("summarize(servers.web1.cpu.user,intervalString='10min',func='max',alignToFrom=true)"),
    "keyword-window": case("movingAverage(seriesList=servers.web1.cpu.user,windowSize='5min')"),
    "keyword-window-positional": case("movingAverage(servers.web1.cpu.user,'5min')"),
    "alias-punctuation": case("alias(servers.web1.cpu.user,\"with, comma (and) 'quotes'\")"),
    "double-quoted-tags": case('seriesByTag("name=cpu.load","host=~web[12]")'),
    "numbers": case("offset(scale(servers.web1.cpu.user,1e-3),-0.5)"),
    "spaces": case(" sumSeries( servers.web1.cpu.user , servers.web2.cpu.user ) "),
    "nested-deep": case(
        f"aliasByNode(highestMax(movingAverage(scale(sumSeriesWithWildcards({CPU},3),0.5),'5min'),2),1)"
    ),
    "from-hhmm-yyyymmdd": case("servers.web1.cpu.user", **{"from": "@HM-7200"}),
    "from-yyyymmdd-tz": case(
        "servers.web1.cpu.user",
        tz="Europe/Berlin",
        **{
            "from": "@HM-3600",
            "until": "@HM+3600",
        },
    ),
    # several targets in one request
    "multiple-targets": case(["servers.web1.cpu.user", f"sumSeries({LOAD})", "constantLine(1)"]),
}


def _window(name: str) -> list:
    """The values of one series over the render range, as both servers return it."""
    window = module_window()
    return [v for t, v in module_data()[name] if window.start < t <= window.now]


def _nist_percentile(values: list, n: float):
    """graphite-web's _getPercentile (nearest rank), written out again for the expectations."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    rank = int(math.ceil(n / 100.0 * (len(ordered) + 1)))
    return ordered[min(max(rank, 1), len(ordered)) - 1]


def _fails_with(reference: dict, text: str) -> None:
    """graphite-web's answer is still the failure the entry explains."""
    assert reference["status"] == 500 and text in reference["body"], (
        f"graphite-web now answers: {reference['body'][:500]}"
    )


def _check_group_by_missing_tag(ours: list, reference: dict, graphite_web: dict) -> None:
    _fails_with(reference, 'Value for tag "rack" may not be empty')
    (series,) = ours
    assert series["target"] == "cpu.load;rack="
    assert series["tags"] == {"name": "cpu.load;rack="}
    (total,) = json.loads(graphite_web["sumSeries-tagged"]["body"])  # the same sum, under another name
    assert_same_render([dict(series, target=total["target"], tags=total["tags"])], [total])


def _check_remove_between_percentile_gaps(ours: list, reference: dict, graphite_web: dict) -> None:
    _fails_with(reference, "TypeError")
    names = sorted(name for name in module_data() if name.startswith("servers.") and ".cpu." in name)
    columns = list(zip(*(_window(name) for name in names)))
    lows = [_nist_percentile(column, 10) for column in columns]
    highs = [_nist_percentile(column, 90) for column in columns]
    expected = [
        name for name in names if any(not lows[i] < v < highs[i] for i, v in enumerate(_window(name)) if v is not None)
    ]
    assert [s["target"] for s in ours] == expected
    assert 0 < len(expected) < len(names)
    for series in ours:
        assert [v for v, _ in series["datapoints"]] == _window(series["target"])


def _check_use_series_above_gaps(ours: list, reference: dict, graphite_web: dict) -> None:
    _fails_with(reference, "TypeError")
    users = sorted(name for name in module_data() if name.startswith("servers.") and name.endswith(".cpu.user"))
    above = [name for name in users if max(v for v in _window(name) if v is not None) > 60]
    assert "servers.web2.cpu.user" in above  # the one with gaps
    assert [s["target"] for s in ours] == [name.replace("user", "system") for name in above]
    for series in ours:
        assert [v for v, _ in series["datapoints"]] == _window(series["target"])


def _check_series_keyword(ours: list, reference: dict, graphite_web: dict) -> None:
    assert (reference["status"], reference["body"]) == (200, "[]")  # the whole target read as the path "movingAverage"
    assert_same_render(ours, json.loads(graphite_web["keyword-window-positional"]["body"]))


def _check_reduce_leaves_out_incomplete_groups(ours: list, reference: dict, graphite_web: dict) -> None:
    _fails_with(reference, "AttributeError")  # diffSeries of [user] and [None]
    assert ours == []  # no host has cpu.user and cpu.bytes under one prefix


def _check_reduce_node_out_of_range(ours: list, reference: dict, graphite_web: dict) -> None:
    _fails_with(reference, "IndexError")
    assert ours == []  # the series 't' has no node 1 to match


def _check_natural_sort_of_long_numbers(ours: list, reference: dict, graphite_web: dict) -> None:
    _fails_with(reference, "Exceeds the limit (4300 digits)")
    prefix = "servers." + "9" * 5000
    assert [s["target"] for s in ours] == [prefix + f"{i}.cpu.user" for i in (1, 2, 3)]
    for series in ours:
        original = series["target"].replace("9" * 5000, "web")
        assert [v for v, _ in series["datapoints"]] == _window(original)


# case id -> (why tsgate answers differently from graphite-web 1.1.8, a check of tsgate's answer)
KNOWN_DIFFERENCES: dict[str, tuple[str, object]] = {
    "groupByTags-missing-tag": (
        "graphite-web 1.1.8 fails (500, 'Value for tag \"rack\" may not be empty') when a grouping tag is "
        "missing from the series: its tag database refuses the group name cpu.load;rack=. tsgate answers "
        "the group under that name with only the name tag, as its TimeSeries does for names it cannot parse.",
        _check_group_by_missing_tag,
    ),
    "removeBetweenPercentile-gaps": (
        "graphite-web 1.1.8 (and its master) compares None with floats and fails with a TypeError (500) as "
        "soon as a series has a null point; tsgate ignores null points (neither inside nor outside the band).",
        _check_remove_between_percentile_gaps,
    ),
    "useSeriesAbove-gaps": (
        "graphite-web 1.1.8 takes max() over values with None and fails with a TypeError (500); later "
        "graphite-web skips such series; tsgate compares the maximum of the non-null values.",
        _check_use_series_above_gaps,
    ),
    "reduceSeries-missing-matcher": (
        "graphite-web 1.1.8 passes None for the missing series to the reduce function and fails (500); "
        "tsgate leaves out a group that lacks a series for one of the matchers, as carbonapi does.",
        _check_reduce_leaves_out_incomplete_groups,
    ),
    "reduceSeries-node-out-of-range": (
        "graphite-web 1.1.8 indexes the name's nodes with reduceNode unchecked (IndexError, a 500); tsgate "
        "leaves out series that have no such node.",
        _check_reduce_node_out_of_range,
    ),
    "sortByName-natural-long-number": (
        "graphite-web 1.1.8 converts each run of digits with int(), which Python refuses beyond 4300 digits "
        "(ValueError, a 500); tsgate pads the digits as text and sorts as graphite-web would without the limit.",
        _check_natural_sort_of_long_numbers,
    ),
    "keyword-window": (
        "graphite-web 1.1.8's grammar takes only scalars as keyword arguments: it parses the leading "
        "'movingAverage' as a path, ignores the rest and answers []; tsgate rejects no valid call and "
        "evaluates seriesList=... like the positional form (docs: 'The parser rejects trailing text').",
        _check_series_keyword,
    ),
}


@pytest.fixture(scope="module")
def window() -> Window:
    return module_window()


@pytest.fixture(scope="module")
def data() -> dict[str, list]:
    return module_data()


@pytest.fixture(scope="module")
def graphite_web(tmp_path_factory, window, data) -> dict[str, dict]:
    """graphite-web's answer to every case, from one subprocess."""
    ids = list(CASES)
    answers = render_batch(
        tmp_path_factory.mktemp("graphite-web"), data, [window.params(CASES[i]) for i in ids], step=STEP
    )
    return dict(zip(ids, answers))


@pytest.fixture(scope="module")
def tsgate(tmp_path_factory, window, data):
    """A real gateway on the embedded store, fed the data over carbon plaintext until /render has it all.

    Module-scoped (``start_gateway`` is per test): one gateway serves the whole corpus.
    """
    process = GatewayProcess(tmp_path_factory.mktemp("tsgate")).start()
    try:
        lines = "".join(
            f"{name} {value!r} {t}\n" for name, points in data.items() for t, value in points if value is not None
        )
        with socket.create_connection(("127.0.0.1", process.graphite_port), timeout=10) as carbon:
            carbon.sendall(lines.encode())
        expected = {name: sum(1 for _, v in points if v is not None) for name, points in data.items()}
        plain = sorted(name for name in data if ";" not in name)
        params = {"target": [*plain, LOAD], "from": str(window.first - 1), "until": str(window.now), "format": "json"}
        deadline = time.monotonic() + 30
        while True:
            answer = process.get("/render?" + urllib.parse.urlencode(params, doseq=True))
            counts = {}
            if answer.status == 200:
                counts = {s["target"]: sum(1 for v, _ in s["datapoints"] if v is not None) for s in answer.json()}
            if counts == expected:
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the gateway did not store all points in 30 s: {answer.status} {counts}\n{process.log()}"
                )
            time.sleep(0.2)
        yield process
    finally:
        process.stop()


def _render(process, window: Window, request: dict):
    answer = process.get("/render?" + urllib.parse.urlencode(window.params(request), doseq=True))
    return answer.status, answer.body.decode()


def _same_value(ours, theirs) -> bool:
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if math.isinf(ours) or math.isinf(theirs):
        return ours == theirs
    return math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=1e-12)


def assert_same_render(ours: list, theirs: list) -> None:
    assert [s["target"] for s in ours] == [s["target"] for s in theirs], "series names or order differ"
    for mine, reference in zip(ours, theirs):
        name = reference["target"]
        assert mine["tags"] == reference["tags"], f"tags of {name}"
        my_times = [t for _, t in mine["datapoints"]]
        their_times = [t for _, t in reference["datapoints"]]
        assert my_times == their_times, f"timestamps of {name}"
        differing = [
            (t, v, w) for (v, t), (w, _) in zip(mine["datapoints"], reference["datapoints"]) if not _same_value(v, w)
        ]
        assert not differing, f"{len(differing)} values of {name} differ (time, tsgate, graphite-web): {differing[:5]}"


@pytest.mark.parametrize("case_id", list(CASES))
def test_render_matches_graphite_web(case_id, graphite_web, tsgate, window):
    reference = graphite_web[case_id]
    status, body = _render(tsgate, window, CASES[case_id])
    if case_id in KNOWN_DIFFERENCES:
        reason, check = KNOWN_DIFFERENCES[case_id]
        assert status == 200, f"tsgate answered {status}: {body[:2000]}"
        check(json.loads(body), reference, graphite_web)
        return
    assert reference["status"] == 200, f"graphite-web answered {reference['status']}: {reference['body'][:2000]}"
    assert status == 200, f"tsgate answered {status}: {body[:2000]}"
    assert_same_render(json.loads(body), json.loads(reference["body"].replace("1e9999", "Infinity")))


def test_corpus_covers_every_function():
    """Each function the brief lists appears in at least one case."""
    required = """sumSeries averageSeries maxSeries minSeries diffSeries divideSeries multiplySeries asPercent
        countSeries alias aliasByNode aliasByMetric aliasSub aliasByTags scale scaleToSeconds offset absolute
        perSecond derivative nonNegativeDerivative integral movingAverage summarize hitcount timeShift delay
        keepLastValue transformNull removeAboveValue removeBelowValue highestCurrent highestMax highestAverage
        lowestCurrent lowestAverage sortByName sortByMaxima limit exclude grep currentAbove currentBelow
        averageAbove maximumAbove groupByNode groupByNodes groupByTags sumSeriesWithWildcards
        averageSeriesWithWildcards nPercentile percentileOfSeries consolidateBy constantLine threshold
        seriesByTag applyByNode color lineWidth dashed stacked""".split()
    text = " ".join(str(c["target"]) for c in CASES.values())
    assert [f for f in required if f + "(" not in text] == []
    assert set(KNOWN_DIFFERENCES) <= set(CASES)
