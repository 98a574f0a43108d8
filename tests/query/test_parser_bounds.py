"""Hostile shapes of query text (issue 38 items 1, 4 and 7): nesting, repetition and size of PromQL
queries and Graphite render targets are bounded before the parser sees them (--query-max-length,
--query-max-depth, --query-max-terms), so none crashes, exhausts or times out a query executor:
each gets a 4xx naming the bound in milliseconds, while /healthz keeps answering. Before,
``'(' * 24000 + '1' + ')' * 24000`` counted as one term and killed an executor with SIGSEGV."""

import random
import statistics
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gatewayproc import GatewayProcess, metric_value

pytestmark = pytest.mark.slow  # every test here runs a gateway process

TIMEOUT_S = 20  # far past any refusal here: a query at the deadline would be a failure, not a pass
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
KILLS = [f'tsgate_query_executor_kills_total{{reason="{reason}"}}' for reason in ("died", "memory", "timeout")]
REFUSED_S = 2.0  # a refusal's bound, generous for a loaded box (6-400 ms measured)
FAST_S = 0.5  # /healthz p99 bound (a few ms on a quiet box)
FUZZ_TENANTS = ("fuzz-1", "fuzz-2")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """Two executors, the default bounds of the text; a counter ``x`` (PromQL) and ``a.b.c`` (Graphite)."""
    gateway = GatewayProcess(
        tmp_path_factory.mktemp("parser-bounds"), "--query-executors=2", f"--query-timeout={TIMEOUT_S}s"
    ).start()
    now = int(time.time())
    samples = [
        {"metricName": "x", "tags": {"job": "a"}, "timestamp": (now - 15 * step) * 1000, "value": step % 7}
        for step in range(480)
    ]
    points = [{"metric": "a.b.c", "timestamp": now - 60 * i, "value": float(i), "tags": {}} for i in range(60)]
    for tenant in ("default", *FUZZ_TENANTS):
        assert gateway.post("/api/write", samples, headers={"X-Scope-OrgID": tenant}).status == 200
        assert gateway.post("/api/put", points, headers={"X-Scope-OrgID": tenant}).status == 200
    yield gateway
    gateway.stop()


def kills(gateway) -> list[float]:
    return [metric_value(gateway, name) for name in KILLS]


def promql(gateway, text: str, tenant: str = "default", **params):
    form = urllib.parse.urlencode({"query": text, **params}).encode()
    return gateway.post("/api/v1/query", form, headers={**FORM, "X-Scope-OrgID": tenant}, timeout=60)


def render(gateway, target: str, tenant: str = "default"):
    form = urllib.parse.urlencode({"target": target, "format": "json", "from": "-1h"}).encode()
    return gateway.post("/render", form, headers={**FORM, "X-Scope-OrgID": tenant}, timeout=60)


@pytest.mark.parametrize(
    "text, setting",
    [
        ("(" * 24000 + "1" + ")" * 24000, "--query-max-depth 64"),  # SIGSEGV in 61-65 ms before
        ("(" * 8000 + "1" + ")" * 8000, "--query-max-depth 64"),  # the 2 GiB memory cap before
        ("-(" * 4000 + "1" + ")" * 4000, "--query-max-depth 64"),  # to the deadline before
        ("-" * 60000 + "x", "--query-max-depth 64"),
        ("sum(" * 10000 + "x" + ")" * 10000, "--query-max-depth 64"),
        ("max_over_time(" * 2500 + "x" + "[1m:1s])" * 2500, "--query-max-depth 64"),
        ("x" + " or x" * 10000, "--query-max-terms 300"),
        ("+".join(["1"] * 30000), "--query-max-terms 300"),
        ("x{" + ",".join(['a="b"'] * 6000) + "}", "--query-max-terms 300"),
        ('label_join(x, "a", ","' + ', "b"' * 10000 + ")", "--query-max-terms 300"),
        ('"\\' * 32000, "escape sequence"),  # 8 s of backtracking in the old term counter's regex
    ],
    ids=[
        "parens-24000",
        "parens-8000",
        "unary-parens-4000",
        "unary-60000",
        "sum-10000",
        "subquery-2500",
        "or-10000",
        "plus-30000",
        "matchers-6000",
        "arguments-10000",
        "escapes-32000",
    ],
)
def test_hostile_promql_is_refused_in_milliseconds(gateway, text, setting):
    before = kills(gateway)
    started = time.perf_counter()
    answer = promql(gateway, text)
    elapsed = time.perf_counter() - started
    print(f"{len(text)} characters: {answer.status} in {elapsed * 1000:.0f} ms")
    assert answer.status == 400, answer.body[:300]
    assert answer.json()["errorType"] == "bad_data" and setting in answer.json()["error"], answer.body[:300]
    assert elapsed < REFUSED_S
    assert kills(gateway) == before, gateway.log()[-2000:]


@pytest.mark.parametrize(
    "text, answered",
    [
        ("-" * 63 + "(x" + "+x" * 236 + ")", True),  # depth 64, 300 terms: the most frames the evaluator takes
        ("max_over_time(" * 62 + "(x" + "+x" * 174 + ")" + "[1m:1m])" * 62, True),
        ("abs(" * 63 + "vector(1)" + ")" * 63, True),
        ("vector(1)" + "+vector(1)" * 149, True),
        ("-" * 64 + "(x)", False),
        ("abs(" * 64 + "vector(1)" + ")" * 64, False),
        ("vector(1)" + "+vector(1)" * 150, False),
    ],
    ids=["unary-chain", "subqueries-chain", "calls-64", "chain-299", "unary-65", "calls-65", "chain-301"],
)
def test_queries_at_the_bounds_are_answered_one_past_them_refused(gateway, text, answered):
    answer = promql(gateway, text)
    if answered:
        assert answer.status == 200 and answer.json()["status"] == "success", answer.body[:300]
    else:
        assert answer.status == 400 and "--query-max-" in answer.json()["error"], answer.body[:300]


@pytest.mark.parametrize("subquery", ["changes(x[1h])[1s:1d]", "rate(x[5m])[1s:1d]", "x[1s:1d]"])
def test_a_subquery_with_no_step_in_its_window_is_empty(gateway, subquery):
    """A 500 "zero-size array" in range_functions before."""
    now = time.time()
    at = now - now % 86400 - 43200.5  # midday yesterday: no whole day in a window of 1 s
    for text in (subquery, f"max_over_time({subquery})"):
        answer = promql(gateway, text, time=str(at))
        assert answer.status == 200 and answer.json()["data"]["result"] == [], answer.body[:300]
    params = {"query": f"max_over_time({subquery})", "start": str(at - 600), "end": str(at), "step": "60"}
    answer = gateway.get("/api/v1/query_range?" + urllib.parse.urlencode(params))
    assert answer.status == 200 and answer.json()["data"]["result"] == [], answer.body[:300]


@pytest.mark.parametrize(
    "target, problem",
    [
        ("sumSeries(" * 5000 + "a.b.c" + ")" * 5000, "--query-max-depth"),
        ("a.b.c" + "|absolute()" * 5000, "--query-max-terms"),
        ("sumSeries(" + ",".join(["a.b.c"] * 10000) + ")", "--query-max-terms"),
        ("timeShift(" * 20 + "a.b.c" + ",'1min')" * 20, "--query-max-terms"),  # 2^20 fetches before
        ("movingAverage(" * 30 + "a.b.c" + ",'1min')" * 30, "--query-max-terms"),
        ("a.{" + ",".join(["b"] * 30000) + "}.c", None),
        ("a" + ".b" * 32000, None),
        ("*" + ".*" * 32000, None),
    ],
    ids=["nested-5000", "piped-5000", "arguments-10000", "timeshift-20", "moving-30", "braces", "dots", "globs"],
)
def test_hostile_graphite_targets_are_refused_or_answered_in_time(gateway, target, problem):
    before = kills(gateway)
    started = time.perf_counter()
    answer = render(gateway, target)
    elapsed = time.perf_counter() - started
    print(f"{len(target)} characters: {answer.status} in {elapsed * 1000:.0f} ms")
    if problem:
        assert answer.status == 400 and problem in answer.json()["error"], answer.body[:300]
    else:
        assert answer.status == 200, answer.body[:300]
    assert elapsed < REFUSED_S
    assert kills(gateway) == before, gateway.log()[-2000:]


# (opening, middle, closing) nested n deep; (head, unit, tail) with the unit repeated n times
PROMQL_NESTED = [
    ("(", "x", ")"),
    ("-(", "x", ")"),
    ("-", "x", ""),
    ("sum(", "x", ")"),
    ("abs(", "vector(1)", ")"),
    ("max_over_time(", "x", "[1m:1s])"),
]
PROMQL_REPEATED = [
    ("x", " or x", ""),
    ("x", "+x", ""),
    ("x", "^-x", ""),
    ('x{a="b"', ',a="b"', "}"),
    ('label_join(x,"a",","', ',"b"', ")"),
    ("", '"\\', ""),
    ("", "[{", ""),
    ("", "1", ""),
    ("x[", "1h", "]"),
]
GRAPHITE_NESTED = [
    ("sumSeries(", "a.b.c", ")"),
    ("timeShift(", "a.b.c", ",'1min')"),
    ("movingAverage(", "a.b.c", ",'1min')"),
    ("timeStack(", "a.b.c", ",'1min',0,20)"),
]
GRAPHITE_REPEATED = [
    ("a.b.c", "|absolute()", ""),
    ("sumSeries(a.b.c", ",a.b.c", ")"),
    ("a.{b", ",b", "}.c"),
    ("a", ".b", ""),
    ("*", ".*", ""),
    ("alias(a.b.c,'", "x", "')"),
    ("", "{(", ""),
]


def hostile_text(rng: random.Random, nested: list, repeated: list) -> str:
    """A shape nested or repeated a random number of times, around the bounds or up to the
    length bound, cut at 64 KB."""
    count = rng.choice([rng.choice([1, 63, 64, 65, 299, 300, 301]), int(10 ** rng.uniform(0, 4.6))])
    if rng.random() < 0.5:
        opening, middle, closing = rng.choice(nested)
        return (opening * count + middle + closing * count)[:65536]
    head, unit, tail = rng.choice(repeated)
    return (head + unit * count + tail)[:65536]


def test_a_fuzz_of_nesting_repetition_and_size_stops_no_executor(gateway):
    """Two tenants send hostile PromQL and Graphite text (each its own seeded sequence) for 8 s
    while /healthz is probed every 50 ms: every answer is a 4xx or an answer (200), no executor
    dies or is killed, and /healthz stays fast."""
    before = kills(gateway)
    done = threading.Event()
    healthz: list[float] = []
    answers: list[tuple[int, float, str]] = []

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert gateway.get("/healthz", timeout=30).status == 200
            healthz.append(time.perf_counter() - started)
            time.sleep(0.05)

    def attack(tenant: str, seed: int) -> None:
        rng = random.Random(seed)
        ends = time.monotonic() + 8
        while time.monotonic() < ends:
            started = time.perf_counter()
            if rng.random() < 0.6:
                text = hostile_text(rng, PROMQL_NESTED, PROMQL_REPEATED)
                answer = promql(gateway, text, tenant)
            else:
                text = hostile_text(rng, GRAPHITE_NESTED, GRAPHITE_REPEATED)
                answer = render(gateway, text, tenant)
            answers.append((answer.status, time.perf_counter() - started, text[:80]))
            assert answer.status in (200, 400, 422), (answer.status, text[:200], answer.body[:300])

    with ThreadPoolExecutor(3) as pool:
        prober = pool.submit(probe)
        attackers = [pool.submit(attack, tenant, 38 + index) for index, tenant in enumerate(FUZZ_TENANTS)]
        try:
            for attacker in attackers:
                attacker.result()
        finally:
            done.set()
        prober.result()
    statuses = {status: sum(1 for s, _, _ in answers if s == status) for status in sorted({s for s, _, _ in answers})}
    slowest = max(answers, key=lambda answer: answer[1])
    p99 = statistics.quantiles(healthz, n=100, method="inclusive")[98]
    print(
        f"fuzz: {len(answers)} hostile requests {statuses}, slowest {slowest[1] * 1000:.0f} ms ({slowest[2]!r});"
        f" /healthz p99 {p99 * 1000:.1f} ms max {max(healthz) * 1000:.1f} ms ({len(healthz)})"
    )
    assert kills(gateway) == before, gateway.log()[-3000:]
    assert len(answers) >= 20 and p99 < FAST_S
