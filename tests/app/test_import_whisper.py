"""``tsgate import whisper``: carbon's whisper files in, graphite-web's answers out.

A tree of 205 whisper files is written as carbon-cache writes them (the ``whisper`` package:
``whisper.create`` with the schema ``10s:1d,1m:7d,10m:1y`` and carbon's stock
storage-aggregation rules, then ``update_many`` in batches), with values over a year and gaps,
plus one corrupt file. It is imported into SQLite and into Cassandra; ``/render`` (JSON) of a
gateway over each must equal graphite-web 1.1.8's ``/render`` over the same files
(tests/graphiteweb.py) over a day, a week and a year: the same series, timestamps and values
(within 1e-9 relative). Targets are wrapped in ``consolidateBy`` with the file's aggregation
method, which graphite-web ignores without ``maxDataPoints`` and tsgate uses for the buckets it
consolidates from raw samples and for the roll-up aggregate it reads (docs/operations.rst says
why). Gaps inside the last day are whole 10 minutes: whisper's xFilesFactor decides a partly
filled bucket of its coarser archives, tsgate's raw consolidation has none (documented, not
compared here). The one case that differs, checked as documented: a ``sum`` file over a week
without ``consolidateBy`` reads the last day's 1 min buckets as the average of their 10 s samples
(graphite-web: the sum, six times as much).

A second run skips every file; the corrupt file is reported (exit code 1) in both runs.
"""

import json
import math
import random
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import pytest_twisted
import whisper

from gateway.app import whisper_files
from gateway.app.cli import build_parser
from gateway.app.config import build_config
from gateway.app.whisper_files import CorruptFile, file_data, read_archives
from gateway.app.whisper_import import FileImporter, Job, graphite_name
from gateway.core.layout import DAY_MS, HOUR_MS, Layout, parse_granularities
from gateway.core.model import SeriesKey, series_set_hash, series_set_text
from gateway.core.overrides import Overrides
from gateway.downsample.aggregate import GAUGE, MAX_ONLY
from gateway.store.blocks import decode_block
from gateway.store.contract import RawPoint
from tests.gatewayproc import REPO, run_tsgate
from tests.graphiteweb import render_batch

SCHEMA = [(10, 8640), (60, 10080), (600, 52560)]  # 10s:1d,1m:7d,10m:1y
SCHEMA_FILE = "[default]\npattern = .*\nretentions = 10s:1d,1m:7d,10m:1y\n"
LAYOUT_FLAGS = ("--raw-retention", "1d", "--granularities", "1m:7d,10m:365d")
# carbon's stock storage-aggregation.conf: (suffix, method, xFilesFactor); the last is the default.
METRICS = [
    ("cpu.idle", "average", 0.5),
    ("net.bytes", "average", 0.5),
    ("requests.count", "sum", 0.0),
    ("load.max", "max", 0.1),
    ("disk.free.min", "min", 0.1),
]
LIGHT_HOSTS = 40
DAY, WEEK = 86400, 7 * 86400


@pytest.fixture
def aligned_now() -> int:
    """The clock when the test starts, on a 10-minute boundary (the unit tests' roll-up buckets
    start there); the whisper tree has its own."""
    return int(time.time()) // 600 * 600


KEYSPACE = "tsgate_test_whisper_import"


def _batches(path: Path, points: list[tuple[int, float]]) -> None:
    """As carbon-cache writes: update_many with what its cache holds, a few hundred points at a time."""
    for start in range(0, len(points), 500):
        whisper.update_many(str(path), points[start : start + 500])


def _series(rng: random.Random, full: bool, now: int) -> list[tuple[int, float]]:
    """Points of one file: a full file has a year at 10 min (a missing week, random holes), the
    week before the last day at 1 min, the last day at 10 s (two 10-minute gaps); a light file a
    few days somewhere in the year, maybe a day of the week, maybe the last two hours."""
    level, points = rng.uniform(10, 1000), []

    def add(first: int, last: int, step: int, holes: float) -> None:
        nonlocal level
        for t in range(first - first % step, last, step):
            level = abs(level + rng.gauss(0, 5))
            if rng.random() >= holes:
                points.append((t, round(level, 3)))

    if full:
        gap = now - rng.randrange(30, 300) * DAY
        add(now - 364 * DAY, gap, 600, 0.05)
        add(gap + WEEK, now - WEEK - 600, 600, 0.05)  # older than the 1 min archive: into the 10 min one
        add(now - WEEK + 600, now - DAY - 600, 60, 0.02)  # older than the 10 s archive: into the 1 min one
        quiet = [now - rng.randrange(2, 20) * 3600, now - rng.randrange(21, 23) * 3600]
        for start, end in [(now - DAY + 600, quiet[1]), (quiet[1] + 600, quiet[0]), (quiet[0] + 600, now)]:
            add(start, end, 10, 0.0)
    else:
        start = now - rng.randrange(10, 360) * DAY
        add(start, start + 3 * DAY, 600, 0.1)
        if rng.random() < 0.5:
            day = now - rng.randrange(2, 7) * DAY
            add(day, day + DAY, 60, 0.05)
        if rng.random() < 0.7:
            add(now - 2 * 3600, now, 10, 0.0)
    return points


class Tree(NamedTuple):
    root: Path
    now: int  # the last point is 10 s before it


@pytest.fixture(scope="module")
def whisper_tree(tmp_path_factory) -> Tree:
    """205 files (5 full, 200 light) under servers/, and servers/broken.wsp cut off in its header,
    written now (carbon writes as points come: what goes to which archive depends on the time)."""
    root = tmp_path_factory.mktemp("whisper")
    now = int(time.time()) // 600 * 600
    rng = random.Random(25)
    hosts = ["full"] + [f"host{n:03d}" for n in range(LIGHT_HOSTS)]
    for host in hosts:
        for metric, method, xff in METRICS:
            path = root / "servers" / host / (metric.replace(".", "/") + ".wsp")
            path.parent.mkdir(parents=True, exist_ok=True)
            whisper.create(str(path), SCHEMA, xFilesFactor=xff, aggregationMethod=method)
            _batches(path, _series(rng, host == "full", now))
    broken = root / "servers" / "broken.wsp"
    broken.write_bytes((root / "servers" / "full" / "cpu" / "idle.wsp").read_bytes()[:20])
    return Tree(root, now)


def _ranges(now: int) -> dict[str, tuple[int, int]]:
    """Render ranges well inside whisper's archive windows and tsgate's retentions. "seven days",
    off the 10-minute grid, starts past the 1-minute archive's 7 days whenever either server
    renders it (graphite-web answers before the import, tsgate after), so both read 10-minute
    data; a start inside them would pick the 1-minute data by one clock and not by the other."""
    return {
        "day": (now - 20 * 3600, now),
        "week": (now - 6 * DAY, now),
        "seven days": (now - 7 * DAY - 53, now - 53),
        "year": (now - 300 * DAY, now),
    }


def _requests(now: int) -> list[dict]:
    return [
        {
            "target": f"consolidateBy(servers.{{full,host00[0-3]}}.{metric},'{method}')",
            "from": start,
            "until": end,
            "format": "json",
        }
        for start, end in _ranges(now).values()
        for metric, method, _ in METRICS
    ]


def _sum_file_without_consolidate_by(now: int) -> dict:
    """The documented difference: a ``sum`` file over a week without ``consolidateBy``."""
    start, end = _ranges(now)["week"]
    return {"target": "servers.full.requests.count", "from": start, "until": end, "format": "json"}


@pytest.fixture(scope="module")
def graphite_answers(whisper_tree: Tree, tmp_path_factory) -> list[list[dict]]:
    answers = render_batch(
        tmp_path_factory.mktemp("graphiteweb"),
        {},
        [*_requests(whisper_tree.now), _sum_file_without_consolidate_by(whisper_tree.now)],
        whisper_dir=whisper_tree.root,
        timeout=600,
    )
    assert all(answer["status"] == 200 for answer in answers), answers[0]["body"][:2000]
    return [json.loads(answer["body"]) for answer in answers]


def _import(tree: Path, tmp_path: Path, tenant: str, *store: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "gateway.app.cli", "import", "whisper", str(tree), "--tenant", tenant]
    command += ["--workers", "2", "--state-dir", str(tmp_path / "state"), "--data-dir", str(tmp_path / "data")]
    return subprocess.run(
        [*command, *LAYOUT_FLAGS, "--log-level", "warning", *store],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _compare(gateway, tenant: str, expected: list[list[dict]], now: int) -> None:
    for request, wanted in zip(_requests(now), expected):
        answer = gateway.get("/render?" + urllib.parse.urlencode(request), headers={"X-Scope-OrgID": tenant})
        assert answer.status == 200, answer.body[:500]
        got = json.loads(answer.body)
        where = f"{request['target']} from {request['from']}"
        assert [s["target"] for s in got] == [s["target"] for s in wanted], where
        assert len(wanted) == 5, where
        for mine, theirs in zip(got, wanted):
            assert [t for _, t in mine["datapoints"]] == [t for _, t in theirs["datapoints"]], where
            for (value, t), (reference, _) in zip(mine["datapoints"], theirs["datapoints"]):
                if reference is None or value is None:
                    assert value is None and reference is None, (
                        f"{where} {mine['target']} at {t}: {value} != {reference}"
                    )
                else:
                    assert math.isclose(value, reference, rel_tol=1e-9, abs_tol=1e-9), (
                        f"{where} {mine['target']} at {t}"
                    )
        assert any(v is not None for s in got for v, _ in s["datapoints"]), where


@pytest.mark.parametrize("backend", ["sqlite", "cassandra"])
def test_imported_whisper_renders_as_graphite_web(
    backend, whisper_tree, graphite_answers, tmp_path, tenant, start_gateway, request
):
    store: tuple[str, ...] = ()
    if backend == "cassandra":
        server = request.getfixturevalue("cassandra_server")
        url = f"cassandra://{server.host}:{server.port}/{KEYSPACE}"
        run_tsgate("schema", "apply", "--store", url, *LAYOUT_FLAGS, timeout=300)
        store = ("--store", url)
    first = _import(whisper_tree.root, tmp_path, tenant, *store)
    assert first.returncode == 1, first.stderr
    assert "could not import servers/broken.wsp: not a readable whisper file" in first.stderr
    assert "imported 205 files" in first.stdout, first.stdout + first.stderr
    print(f"\n{backend}: {first.stdout.strip()}")

    again = _import(whisper_tree.root, tmp_path, tenant, *store)
    assert again.returncode == 1
    assert "imported 0 files, 0 points" in again.stdout and "205 skipped as already imported" in again.stdout
    assert "could not import servers/broken.wsp" in again.stderr

    schemas = tmp_path / "storage-schemas.conf"
    schemas.write_text(SCHEMA_FILE)
    gateway = start_gateway(
        *store, "--data-dir", str(tmp_path / "data"), "--graphite-storage-schemas", str(schemas), *LAYOUT_FLAGS
    )
    headers = {"X-Scope-OrgID": tenant}
    found = json.loads(gateway.get("/metrics/find?query=servers.*", headers=headers).body)
    assert sorted(node["text"] for node in found) == sorted(["full", *(f"host{n:03d}" for n in range(LIGHT_HOSTS))])
    tagged = gateway.get(
        "/tags/findSeries?" + urllib.parse.urlencode({"expr": r"name=~servers\.full\."}), headers=headers
    )
    assert sorted(json.loads(tagged.body)) == sorted(f"servers.full.{metric}" for metric, _, _ in METRICS)
    _compare(gateway, tenant, graphite_answers, whisper_tree.now)
    _check_the_documented_difference(gateway, tenant, graphite_answers[-1], whisper_tree.now)


def _check_the_documented_difference(gateway, tenant: str, expected: list[dict], now: int) -> None:
    """Without consolidateBy, tsgate averages the raw 10 s samples of the last day into the week's
    1 min buckets where whisper's 1 min archive summed them (docs/operations.rst): there, and only
    there (after the raw retention's start when the gateway reads), graphite-web's value is six
    times tsgate's (every minute of the last day is whole)."""
    request = _sum_file_without_consolidate_by(now)
    answer = gateway.get("/render?" + urllib.parse.urlencode(request), headers={"X-Scope-OrgID": tenant})
    ((mine,), (theirs,)) = json.loads(answer.body), expected
    assert [t for _, t in mine["datapoints"]] == [t for _, t in theirs["datapoints"]]
    averaged = 0
    for (value, t), (reference, _) in zip(mine["datapoints"], theirs["datapoints"]):
        if value is None or reference is None:
            assert value is None and reference is None, t
        elif not math.isclose(value, reference, rel_tol=1e-9):  # read from the imported 1 min roll-ups
            assert math.isclose(value * 6, reference, rel_tol=1e-9) and t >= now - DAY, t
            averaged += 1
    assert averaged > 20 * 60


LAYOUT = Layout(HOUR_MS, DAY_MS, parse_granularities("1m:7d,5m:14d,10m:365d", HOUR_MS))


def test_archives_go_to_raw_blocks_and_to_the_matching_or_derived_roll_ups(tmp_path, aligned_now):
    path = tmp_path / "a.wsp"
    whisper.create(str(path), SCHEMA, xFilesFactor=0.5, aggregationMethod="average")
    whisper.update_many(str(path), [(aligned_now - 3 * DAY + 60 * i, float(i)) for i in range(10)], now=aligned_now)
    whisper.update_many(str(path), [(aligned_now - 3600 + 10 * i, 100.0 + i) for i in range(6)], now=aligned_now)
    archives = read_archives(path, aligned_now)
    assert [a.step_s for a in archives] == [10, 60, 600]
    data = file_data("t", "h", GAUGE, archives, LAYOUT, aligned_now)
    (slot,) = data.raw_slots
    assert slot == (aligned_now - 3600 - (aligned_now - 3600) % 3600) * 1000 and data.raw_slots[
        slot
    ].values.tolist() == [100.0 + i for i in range(6)]
    one_minute = {row.timestamp_ms // 1000: row for row in data.rollups["1m"]}
    assert one_minute[aligned_now - 3 * DAY + 60].sum == 1.0 and one_minute[aligned_now - 3 * DAY + 60].count == 1
    assert one_minute[aligned_now - 3600].sum == sum(100.0 + i for i in range(6)) / 6  # whisper's own average
    five = {row.timestamp_ms // 1000: row for row in data.rollups["5m"]}  # no 5m archive: from the 1m one
    assert (five[aligned_now - 3 * DAY].sum, five[aligned_now - 3 * DAY].count) == (0 + 1 + 2 + 3 + 4, 5)
    assert (five[aligned_now - 3 * DAY].min, five[aligned_now - 3 * DAY].max) == (0.0, 4.0)
    assert data.unused_archives == 0
    maxima = file_data("t", "h", MAX_ONLY, archives, LAYOUT, aligned_now).rollups["5m"]
    assert maxima[0].max == 4.0 and maxima[0].sum is None


def test_points_past_a_retention_are_left_out(tmp_path, aligned_now):
    path = tmp_path / "a.wsp"
    whisper.create(str(path), SCHEMA, xFilesFactor=0.0, aggregationMethod="average")
    whisper.update_many(
        str(path),
        [(aligned_now - 100 * DAY, 1.0), (aligned_now - 10 * DAY, 2.0), (aligned_now - 2 * DAY, 3.0)],
        now=aligned_now,
    )
    data = file_data("t", "h", GAUGE, read_archives(path, aligned_now), LAYOUT, aligned_now)
    assert data.raw_slots == {}
    assert [row.sum for row in data.rollups["1m"]] == [3.0]
    assert [row.sum for row in data.rollups["5m"]] == [3.0]
    assert [row.sum for row in data.rollups["10m"]] == [1.0, 2.0, 3.0]


def test_stale_points_of_an_earlier_lap_are_not_read(tmp_path, aligned_now):
    """A ring slot still holding a point from more than its retention ago is not data (whisper's fetch skips it)."""
    path = tmp_path / "a.wsp"
    whisper.create(str(path), [(60, 10)], xFilesFactor=0.0)
    whisper.update_many(str(path), [(aligned_now - 300, 5.0), (aligned_now - 60, 6.0)], now=aligned_now)
    (archive,) = read_archives(path, aligned_now + 3600)
    assert len(archive.samples) == 0
    (archive,) = read_archives(path, aligned_now)
    assert archive.samples.values.tolist() == [5.0, 6.0]


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage", None],  # None: a whole header whose archive runs past the end of the file
)
def test_corrupt_files_are_refused_with_a_reason(tmp_path, content, aligned_now):
    path = tmp_path / "a.wsp"
    whisper.create(str(path), SCHEMA)
    data = path.read_bytes()
    path.write_bytes(data[:100] if content is None else content)
    with pytest.raises(CorruptFile):
        read_archives(path, aligned_now)


def test_paths_from_file_names():
    assert graphite_name("servers/web1/cpu.wsp", "") == ("servers.web1.cpu", {})
    assert graphite_name("servers/web1/cpu.wsp", "old.") == ("old.servers.web1.cpu", {})
    assert graphite_name("_tagged/abc/def/disk_DOT_used;dc=eu;host=a.wsp", "") == (
        "disk.used",
        {"dc": "eu", "host": "a"},
    )


def test_timestamps_of_raw_blocks_are_milliseconds(tmp_path, aligned_now):
    path = tmp_path / "a.wsp"
    whisper.create(str(path), SCHEMA)
    whisper.update_many(str(path), [(aligned_now - 50, 1.5)], now=aligned_now)
    data = file_data("t", "h", GAUGE, read_archives(path, aligned_now), LAYOUT, aligned_now)
    (samples,) = data.raw_slots.values()
    assert samples.timestamps.dtype == np.int64 and samples.timestamps.tolist() == [(aligned_now - 50) * 1000]


@pytest.mark.slow  # runs tsgate processes over the 205 files
def test_an_interrupted_import_goes_on_where_it_stopped(whisper_tree, tmp_path, tenant):
    """SIGTERM once the first files are recorded: exit 130; the next run imports only the others."""
    command = [sys.executable, "-m", "gateway.app.cli", "import", "whisper", str(whisper_tree.root), "--tenant", tenant]
    command += ["--workers", "1", "--state-dir", str(tmp_path / "state"), "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(
        [*command, *LAYOUT_FLAGS], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not any(len(p.read_text().splitlines()) >= 3 for p in (tmp_path / "state").glob("*.done")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted:" in stderr
    (state,) = (tmp_path / "state").glob("*.done")
    recorded = len(state.read_text().splitlines())
    assert 3 <= recorded < 205
    again = subprocess.run([*command, *LAYOUT_FLAGS], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert again.returncode == 1, again.stderr  # the corrupt file, still
    assert f"imported {205 - recorded} files" in again.stdout
    assert f"{recorded} skipped as already imported" in again.stdout
    assert len(state.read_text().splitlines()) == 205


def test_archives_read_in_chunks_give_the_same_points(tmp_path, monkeypatch, aligned_now):
    """Chunks of 7 points (whisper_files.CHUNK_POINTS), and a sparse file's holes skipped: the same
    points as one read of each archive."""
    path = tmp_path / "a.wsp"
    whisper.create(str(path), SCHEMA, xFilesFactor=0.0, sparse=True)
    whisper.update_many(str(path), [(aligned_now - 3 * DAY + 60 * i, float(i)) for i in range(100)], now=aligned_now)
    whisper.update_many(str(path), [(aligned_now - 3600 + 10 * i, 100.0 + i) for i in range(50)], now=aligned_now)
    whole = read_archives(path, aligned_now)
    monkeypatch.setattr(whisper_files, "CHUNK_POINTS", 7)
    chunked = read_archives(path, aligned_now)
    assert [len(a.samples) for a in chunked] == [50, 109, 11]
    for one, other in zip(whole, chunked):
        assert one.samples.timestamps.tolist() == other.samples.timestamps.tolist()
        assert one.samples.values.tolist() == other.samples.values.tolist()


@pytest.mark.slow  # runs a tsgate import process
def test_a_sparse_file_costs_its_points_and_symlinks_out_are_refused(tmp_path, tenant):
    """A sparse 1.2 GB file of ten points (one archive of 1e8 points at 1 s) is imported at the
    memory of its ten points: the import's peak RSS, all its processes, under 400 MiB (2.9 GB
    before, 5.2 GB on a loaded box). A symlink to a whisper file outside the directory is refused
    and named; a symlink inside it and the other files are imported (exit 1, for the refusal)."""
    now = int(time.time())
    tree = tmp_path / "w"
    (tree / "a").mkdir(parents=True)
    sparse = tree / "sparse.wsp"
    whisper.create(str(sparse), [(1, 10**8)], xFilesFactor=0.0, sparse=True)
    whisper.update_many(str(sparse), [(now - 60 * i, float(i)) for i in range(10)], now=now)
    assert sparse.stat().st_size == 1_200_000_028
    for path in (tree / "a" / "b.wsp", tmp_path / "secret.wsp"):
        whisper.create(str(path), SCHEMA)
        whisper.update_many(str(path), [(now - 50, 1.0)], now=now)
    (tree / "alias.wsp").symlink_to(tree / "a" / "b.wsp")
    (tree / "a" / "leak.wsp").symlink_to(tmp_path / "secret.wsp")
    command = [sys.executable, "-m", "gateway.app.cli", "import", "whisper", str(tree), "--tenant", tenant]
    command += ["--workers", "1", "--state-dir", str(tmp_path / "state"), "--data-dir", str(tmp_path / "data")]
    measured = (
        "import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True)"
    )
    measured += "; print(json.dumps([r.returncode, r.stdout, r.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))"
    result = subprocess.run(
        [sys.executable, "-c", measured, *command, *LAYOUT_FLAGS], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    returncode, stdout, stderr, peak_kib = json.loads(result.stdout)
    assert returncode == 1, stderr
    assert "imported 3 files, 12 points" in stdout and "1 could not be imported" in stdout
    secret = (tmp_path / "secret.wsp").resolve()
    assert f"could not import a/leak.wsp: a symlink to {secret}, outside {tree.resolve()}: refused" in stderr
    assert peak_kib < 400 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"


def test_an_archive_no_table_can_take_is_counted(tmp_path, aligned_now):
    path = tmp_path / "a.wsp"
    whisper.create(str(path), [(10, 8640), (60, 10080), (420, 10000)], xFilesFactor=0.0)  # 7 min: no granularity
    whisper.update_many(str(path), [(aligned_now - 30 * DAY, 1.0), (aligned_now - 50, 2.0)], now=aligned_now)
    data = file_data("t", "h", GAUGE, read_archives(path, aligned_now), LAYOUT, aligned_now)
    assert data.unused_archives == 1
    assert data.points == 1 + 1 + 2  # the 7 min archive holds both points: it is read, not written


@pytest.fixture
def store_layout() -> Layout:
    return Layout(HOUR_MS, DAY_MS, parse_granularities("1m:7d,10m:365d", HOUR_MS))


@pytest_twisted.ensureDeferred
async def test_samples_the_store_holds_already_are_merged_in_and_win(tmp_path, sqlite_store, tenant, aligned_now):
    """A gateway wrote the series meanwhile (a head row of the slot the import writes): the block
    holds both, the gateway's value where both have a timestamp, and the head row counts as sealed."""
    now = aligned_now - 600
    path = tmp_path / "w" / "a" / "b.wsp"
    path.parent.mkdir(parents=True)
    whisper.create(str(path), SCHEMA)
    whisper.update_many(str(path), [(now - 120, 1.0), (now - 60, 2.0)], now=now)
    key = SeriesKey(tenant, series_set_hash(series_set_text("a.b", {})), "a.b", {})
    await sqlite_store.write_series([key])
    await sqlite_store.write_raw([RawPoint(tenant, key.series_set_hash, (now - 60) * 1000, 99.0)])
    arguments = ["import", "whisper", str(tmp_path / "w"), "--raw-retention", "1d", "--granularities", "1m:7d,10m:365d"]
    config = build_config(build_parser().parse_args(arguments))
    importer = FileImporter(sqlite_store, Job(config, tmp_path / "w", tenant, "", now))
    assert await importer.import_file("a/b.wsp") == (2, 0, None)  # xFilesFactor 0.5: nothing propagated
    (found,) = await sqlite_store.read_raw(tenant, [key.series_set_hash], (now - DAY) * 1000, now * 1000)
    assert len(found.head) == 0
    (block,) = found.blocks
    assert decode_block(block)[1].tolist() == [1.0, 99.0]


@pytest_twisted.ensureDeferred
async def test_a_tenant_with_its_own_raw_retention_gets_raw_blocks_only_within_it(
    tmp_path, sqlite_store, tenant, aligned_now
):
    """--overrides gives the tenant 2 h of raw data: older points of the file go to roll-ups only."""
    now = aligned_now - 600
    path = tmp_path / "w" / "a.wsp"
    path.parent.mkdir(parents=True)
    whisper.create(str(path), SCHEMA, xFilesFactor=0.0)
    whisper.update_many(str(path), [(now - 5 * 3600, 1.0), (now - 60, 2.0)], now=now)
    overrides = tmp_path / "overrides.toml"
    overrides.write_text(f'[tenants.{tenant}]\nraw-retention = "2h"\n')
    arguments = ["import", "whisper", str(tmp_path / "w"), *LAYOUT_FLAGS, "--overrides", str(overrides)]
    config = build_config(build_parser().parse_args(arguments))
    overrides = Overrides(config)
    overrides.load()
    sqlite_store.retentions = overrides.retentions  # as gateway.app.components wires a store
    importer = FileImporter(sqlite_store, Job(config, tmp_path / "w", tenant, "", now))
    assert (await importer.import_file("a.wsp"))[2] is None
    key = series_set_hash(series_set_text("a", {}))
    (found,) = await sqlite_store.read_raw(tenant, [key], (now - DAY) * 1000, now * 1000)
    assert [decode_block(block)[1].tolist() for block in found.blocks] == [[2.0]]
    rollups = await sqlite_store.read_rollups(config.layout.granularity("1m"), tenant, key, 0, now * 1000)
    assert [row.sum for row in rollups] == [1.0, 2.0]
