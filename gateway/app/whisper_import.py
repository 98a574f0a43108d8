"""``tsgate import whisper DIR``: carbon's whisper files into the store, in worker processes.

The parent lists the ``*.wsp`` files, skips those its state file says are done, hands the rest to
``--workers`` processes through a queue, draws the progress and appends each finished file to
the state file; it never opens the store. Each worker runs a reactor of its own with its own store
connection and imports a few files at a time: the archives become sealed blocks and roll-up rows
(gateway/app/whisper_files.py), written straight through the store contract (no head rows, nothing
for the downsampler to do), then the series is registered (path tree, name index). A file is
recorded as done only after all of that succeeded, so a run stopped anywhere redoes at most the
files in flight, whose writes are upserts. docs/operations.rst ("Moving from carbon + whisper").
"""

import hashlib
import multiprocessing
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

from twisted.internet import defer, reactor, task, threads

from gateway.app.components import Components
from gateway.app.config import Config
from gateway.app.logs import setup_logging
from gateway.app.whisper_files import CorruptFile, by_slot, file_data, read_archives
from gateway.core import samples
from gateway.core.model import (
    InvalidSample,
    Limits,
    SeriesKey,
    now_ms,
    series_set_hash,
    series_set_text,
    validate_series,
)
from gateway.downsample.aggregate import AGGREGATORS, series_kind
from gateway.store.blocks import encode_block
from gateway.store.read_path import stitch_raw

STORE_ATTEMPTS = 3  # tries of a file whose writes fail, 1 s then 2 s apart
LANES_PER_WORKER = 4  # files a worker has in flight: one decodes while the others' writes wait on the store
PLAIN_PROGRESS_EVERY_S = 5.0
TAGGED_DIR = "_tagged"


class WhisperFile(NamedTuple):
    relative: str  # path under DIR, as the state file records it
    size: int
    mtime_ns: int

    @property
    def state_line(self) -> str:
        return f"{self.relative}\t{self.size}\t{self.mtime_ns}\n"


def graphite_name(relative: str, prefix: str) -> tuple[str, dict[str, str]]:
    """The series of a file: ``a/b/c.wsp`` is ``a.b.c`` (``P.a.b.c`` with a prefix); carbon's
    tagged files (``_tagged/xxx/yyy/name;k=v.wsp``, dots written ``_DOT_``) are ``name`` with tags."""
    stem = relative[: -len(".wsp")]
    parts = stem.split("/")
    if parts[0] == TAGGED_DIR and len(parts) == 4:
        name, *pairs = parts[-1].replace("_DOT_", ".").split(";")
        tags = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    else:
        name, tags = ".".join(parts), {}
    return (f"{prefix.rstrip('.')}.{name}" if prefix else name), tags


class OutsideDirectory(ValueError):
    """A file under the import directory that is a symlink to a file outside it."""


def check_inside(directory: Path, path: Path) -> None:
    """OutsideDirectory when ``path`` (a symlink, or under one) resolves outside ``directory``."""
    target, root = path.resolve(), directory.resolve()
    if not target.is_relative_to(root):
        raise OutsideDirectory(f"a symlink to {target}, outside {root}: refused")


class Listing(NamedTuple):
    files: list[WhisperFile]
    refused: list[tuple[str, str]]  # (path under DIR, why it is not imported)


def whisper_files(directory: Path) -> Listing:
    """Every ``*.wsp`` under the directory, in path order. A symlink leading out of the directory
    is refused (an import reads the tree it was given, nothing a link in it points at), as is one
    leading nowhere; symlinked directories are not walked into."""
    files, refused = [], []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".wsp"):
                path = Path(root, name)
                relative = path.relative_to(directory).as_posix()
                try:
                    check_inside(directory, path)
                    status = path.stat()
                except (OutsideDirectory, OSError) as error:
                    refused.append((relative, str(error)))
                    continue
                files.append(WhisperFile(relative, status.st_size, status.st_mtime_ns))
    return Listing(files, refused)


def state_path(state_dir: Path, directory: Path, tenant: str, prefix: str, store_url: str) -> Path:
    """One state file per (directory, tenant, prefix, store): another import never skips by mistake."""
    key = "\0".join([str(directory.resolve()), tenant, prefix, store_url])
    return state_dir / f"whisper-{hashlib.sha256(key.encode()).hexdigest()[:16]}.done"


def read_state(path: Path) -> set[str]:
    """The state lines of the files already imported (a file changed since is imported again)."""
    try:
        return set(path.read_text(encoding="utf-8").splitlines(keepends=True))
    except FileNotFoundError:
        return set()


class Job(NamedTuple):
    """What every worker needs, sent once to each."""

    config: Config
    directory: Path
    tenant: str
    prefix: str
    now_s: int  # retentions and whisper's windows are judged at the start of the run


def run_import(config: Config, directory: Path, tenant: str, prefix: str, workers: int, state_dir: Path) -> int:
    """The whole command; returns the exit code (1 when a file could not be imported)."""
    files, refused = whisper_files(directory)
    state_dir.mkdir(parents=True, exist_ok=True)
    state = state_path(state_dir, directory, tenant, prefix, config.store_url)
    done = read_state(state)
    todo = [f for f in files if f.state_line not in done]
    print(
        f"{len(files)} whisper files under {directory}: {len(files) - len(todo)} already imported"
        f" (state file {state}), {len(todo)} to import" + (f"; {len(refused)} refused (below)" if refused else ""),
        file=sys.stderr,
        flush=True,
    )
    progress = Progress(len(todo), sum(f.size for f in todo), sys.stderr)
    failed = list(refused)
    if todo:
        job = Job(config, directory, tenant, prefix, int(time.time()))
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: its own reactor and store
        tasks, results = context.Queue(), context.Queue()
        for index in range(len(todo)):
            tasks.put(index)
        count = max(1, min(workers, len(todo)))
        for _ in range(count * LANES_PER_WORKER):
            tasks.put(None)
        processes = [
            context.Process(target=worker_main, args=(job, [f.relative for f in todo], tasks, results), daemon=True)
            for _ in range(count)
        ]
        for process in processes:
            process.start()
        signal.signal(signal.SIGTERM, _interrupted)  # stopped as by Ctrl-C: workers ended, what is done recorded
        try:
            with state.open("a", encoding="utf-8") as record:
                _collect(todo, results, processes, progress, record, failed)
        except KeyboardInterrupt:
            _stop(processes)
            progress.finish()
            print(f"interrupted: {progress.files} files imported are recorded; run again to go on", file=sys.stderr)
            return 130
        finally:
            for process in processes:
                process.join(timeout=5)
                if process.is_alive():
                    _stop([process])
    progress.finish()
    for relative, reason in failed:
        print(f"could not import {relative}: {reason}", file=sys.stderr)
    print(
        f"imported {progress.files} files, {progress.points} points in {progress.elapsed():.1f} s"
        f" ({progress.rate():.0f} points/s); {len(files) - len(todo)} skipped as already imported;"
        f" {len(failed)} could not be imported"
        + (
            f"; {progress.unused_archives} archives fed no table (no granularity fits their step)"
            if progress.unused_archives
            else ""
        ),
        flush=True,
    )
    return 1 if failed else 0


def _stop(processes) -> None:
    """SIGKILL: a worker waiting on the queue would not stop for SIGTERM (its reactor waits for the
    thread blocked in get); what it was writing is redone by the next run, as upserts."""
    for process in processes:
        process.kill()


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def _collect(todo, results, processes, progress, record, failed) -> None:
    """Each worker's answers until every file has one (or no worker is left to give one)."""
    answered = 0
    while answered < len(todo):
        try:
            answer = results.get(timeout=0.5)
        except queue.Empty:
            if not any(process.is_alive() for process in processes):
                break
            progress.draw()
            continue
        if answer[0] == "fatal":
            failed.append(("(every file)", answer[1]))
            _stop(processes)
            return
        _, index, points, unused, error = answer
        answered += 1
        if error is None:
            record.write(todo[index].state_line)
            record.flush()
            progress.add(todo[index].size, points)
            progress.unused_archives += unused
        else:
            failed.append((todo[index].relative, error))
            progress.add(todo[index].size, 0, failed=True)
    if answered < len(todo):
        failed.append(("(the rest)", f"{len(todo) - answered} files were not answered: a worker died"))


class Progress:
    """Files, points and points/s: one redrawn line on a terminal, a plain line every few seconds otherwise."""

    def __init__(self, total_files: int, total_bytes: int, stream):
        self.total_files, self.total_bytes = total_files, total_bytes
        self.files = self.failed = self.points = self.bytes = 0
        self.unused_archives = 0  # archives of imported files that fed no table
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._drawn = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def rate(self) -> float:
        return self.points / max(self.elapsed(), 1e-9)

    def add(self, size: int, points: int, failed: bool = False) -> None:
        self.bytes += size
        self.points += points
        self.files += not failed
        self.failed += failed
        self.draw()

    def line(self) -> str:
        finished = self.files + self.failed
        share = self.bytes / self.total_bytes if self.total_bytes else 1.0
        failed = f", {self.failed} unreadable" if self.failed else ""
        # time left from the share of bytes done, once it says something (not after one small file)
        left = f", {self.elapsed() * (1 - share) / share:.0f} s left" if share >= 0.02 and self.files else ""
        return f"{finished}/{self.total_files} files{failed}, {self.points:,} points, {self.rate():,.0f} points/s{left}"

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty and (force or now - self._drawn >= 0.2):
            share = self.bytes / self.total_bytes if self.total_bytes else 1.0
            bar = "#" * int(share * 30)
            self.stream.write(f"\r[{bar:<30}] {self.line()}\033[K")
        elif not self.tty and (force or now - self._drawn >= PLAIN_PROGRESS_EVERY_S):
            self.stream.write(f"import: {self.line()}\n")
        else:
            return
        self.stream.flush()
        self._drawn = now

    def finish(self) -> None:
        if self.total_files:
            self.draw(force=True)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()


def worker_main(job: Job, relatives: list[str], tasks, results) -> None:
    """A worker process: a reactor, a store, and LANES_PER_WORKER files in flight until the queue's end."""
    setup_logging(job.config.log_level, f"import worker pid {os.getpid()}")
    task.react(lambda reactor: defer.ensureDeferred(_work(job, relatives, tasks, results)))


async def _work(job: Job, relatives: list[str], tasks, results) -> None:
    components = Components(job.config).target("import")  # the tenant's own retentions: what is left out, the TTLs
    store = components.get("store")
    try:
        await components.start_store()
    except Exception as error:
        results.put(("fatal", f"could not start the store: {error}"))
        return
    importer = FileImporter(store, job)

    async def lane():
        while (index := await threads.deferToThread(tasks.get)) is not None:
            results.put(("file", index, *await importer.import_file(relatives[index])))

    try:
        await defer.gatherResults([defer.ensureDeferred(lane()) for _ in range(LANES_PER_WORKER)], consumeErrors=True)
    finally:
        await store.close()


class FileImporter:
    """One worker's writer: a whisper file's blocks, roll-ups and index rows through the store contract."""

    def __init__(self, store, job: Job):
        self.store = store
        self.job = job
        self.layout = store.retentions.for_tenant(job.tenant)
        self.limits = Limits()
        self.counter_suffixes = tuple(filter(None, job.config.counter_suffixes.split(",")))

    async def import_file(self, relative: str) -> tuple[int, int, str | None]:
        """(points read, archives unused, None) once written; (0, 0, why) for a file that cannot be
        read, or written after STORE_ATTEMPTS tries (not recorded, so a later run tries again)."""
        failure = ""
        for attempt in range(1, STORE_ATTEMPTS + 1):
            try:
                return *await self._import(relative), None
            except CorruptFile as error:
                return 0, 0, f"not a readable whisper file: {error}"
            except InvalidSample as error:
                return 0, 0, f"not a valid series name: {error}"
            except OutsideDirectory as error:
                return 0, 0, str(error)
            except Exception as error:  # the store refused or timed out: again, after a while
                cause = error.subFailure.value if isinstance(error, defer.FirstError) else error
                failure = f"{type(cause).__name__}: {cause}"
            if attempt < STORE_ATTEMPTS:
                await task.deferLater(reactor, attempt, lambda: None)
        return 0, 0, failure

    async def _import(self, relative: str) -> tuple[int, int]:
        job = self.job
        name, tags = graphite_name(relative, job.prefix)
        validate_series(name, tags, self.limits)
        key = SeriesKey(job.tenant, series_set_hash(series_set_text(name, tags)), name, tags)
        path = job.directory / relative
        check_inside(job.directory, path)  # again: the file may have been made a symlink since it was listed
        archives = read_archives(path, job.now_s)
        kind = series_kind(name, None, self.counter_suffixes)
        data = file_data(key.tenant, key.series_set_hash, kind, archives, self.layout, job.now_s)
        await self._write_blocks(key, data.raw_slots)
        await defer.gatherResults(
            [
                self.store.write_rollups(g, data.rollups[g.name])
                for g in self.layout.granularities
                if data.rollups[g.name]
            ],
            consumeErrors=True,
        )
        await self.store.write_series([key])  # last: a path the index shows has its data
        await self.store.write_series_buckets([(key, bucket) for bucket in data.raw_buckets])
        await self.store.add_metric_aggregators(key.tenant, name, AGGREGATORS[kind])
        return data.points, data.unused_archives

    async def _write_blocks(self, key, raw_slots) -> None:
        """A block per slot; where the store holds samples of the series in those slots already
        (blocks, or head rows a gateway wrote meanwhile), they are merged in and win, as the
        downsampler seals a slot (the head rows merged are passed as sealed)."""
        if not raw_slots:
            return
        width = self.layout.slot_width_ms
        first, last = min(raw_slots), max(raw_slots) + width - 1
        head_read = now_ms()
        (found,) = await self.store.read_raw(key.tenant, [key.series_set_hash], first, last)
        stored = by_slot(stitch_raw(found, first, last), width)
        heads = by_slot(found.head, width)
        writes = []
        for slot, imported in raw_slots.items():
            merged = samples.merge([imported, stored.get(slot, samples.empty())])
            block = encode_block(merged.timestamps, merged.values)
            sealed = heads.get(slot, samples.empty())
            writes.append(self.store.write_block(key.tenant, key.series_set_hash, slot, block, sealed, head_read))
        await defer.gatherResults(writes, consumeErrors=True)
