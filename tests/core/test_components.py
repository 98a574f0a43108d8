"""Small parts of the service on their own: the LRU map behind every cache, the slot holds of
pending marks and head_written_at, and the Cassandra request queue's bound (driven through a
session whose requests the test completes by hand, as the driver's I/O thread would)."""

import json

import pytest
import pytest_twisted
from cassandra import DriverException
from twisted.internet import defer, task
from twisted.python.failure import Failure

from gateway.core.caches import LRUMap, SlotHolds
from gateway.http.ops import HEALTHZ_DEADLINE_S, STORE_STALE_AFTER_S, OpsAPI
from gateway.ingest.metadata_cache import SeenSeries
from gateway.store import StoreUnavailable
from gateway.store.cassandra_requests import RequestQueue


def test_lru_map_forgets_the_least_recently_used():
    lru = LRUMap(3)
    lru.add_all({"a": 1, "b": 2, "c": 3})
    assert lru.get("a") == 1  # now the most recent
    lru.add_all({"d": 4})
    assert len(lru) == 3 and lru.get("b") is None
    lru.add_all({"c": 30, "e": 5})  # c refreshed by the update, a is now the oldest
    assert [lru.get(k) for k in "acde"] == [None, 30, 4, 5]
    with pytest.raises(TypeError):
        lru.get(["unhashable"])


def test_lru_map_keeps_only_the_newest_of_a_batch_larger_than_itself():
    lru = LRUMap(2)
    lru.add_all({i: i for i in range(5)})
    assert len(lru) == 2 and lru.get(3) == 3 and lru.get(4) == 4 and lru.get(2) is None


def test_slot_holds_pass_with_time_and_are_swept_when_full_or_a_slot_later():
    holds = SlotHolds(max_entries=4, slot_width_ms=1000)
    assert holds.unheld("t", 0, ["a", "b", "a"], now=10) == ["a", "b"]
    holds.hold("t", 0, ["a", "b"], until=500, now=10)
    assert holds.unheld("t", 0, ["a", "b", "c"], now=499) == ["c"]
    assert holds.unheld("u", 0, ["a"], now=499) == ["a"]  # another tenant
    assert holds.unheld("t", 0, ["a", "b"], now=500) == ["a", "b"]  # passed
    holds.hold("t", 1000, ["x", "y"], until=2500, now=20)
    holds.hold("t", 1000, ["z"], until=2500, now=30)  # full: not remembered
    assert holds.unheld("t", 1000, ["x", "y", "z"], now=40) == ["z"]
    holds.hold("t", 1000, ["z"], until=2600, now=1500)  # a slot later: the passed holds of slot 0 swept
    assert holds.unheld("t", 1000, ["x", "y", "z"], now=1600) == []


def test_seen_series_is_a_set_on_the_same_bound():
    seen = SeenSeries(2)
    seen.add_all([("t", "a"), ("t", "b"), ("t", "c")])
    assert ("t", "a") not in seen and ("t", "c") in seen and len(seen) == 2


class Future:
    """A request the driver is running: ``page`` and ``fail`` complete it as its I/O thread would."""

    def __init__(self, statement):
        self.statement = statement
        self.has_more_pages = False
        self.fetches = 0

    def add_callbacks(self, callback, errback, callback_args, errback_args):
        self._callback, self._errback = callback, errback
        self._callback_args, self._errback_args = callback_args, errback_args

    def clear_callbacks(self):
        """As the driver's: a finished request drops its callbacks (and what their arguments hold)."""
        self._callback = self._errback = None
        self._callback_args = self._errback_args = ()

    def start_fetching_next_page(self):
        self.fetches += 1

    def page(self, rows, more: bool = False):
        self.has_more_pages = more
        self._callback(rows, *self._callback_args)

    def fail(self, error):
        self._errback(error, *self._errback_args)


class Session:
    """Records the requests started; a statement named "refused" is refused by the driver at once."""

    def __init__(self):
        self.started: list[Future] = []

    def execute_async(self, statement, parameters, execution_profile):
        if statement == "refused":
            raise DriverException("no host available")
        future = Future(statement)
        self.started.append(future)
        return future


class StoreError(Exception):
    pass


def queue_of(limit: int) -> tuple[Session, RequestQueue]:
    session = Session()
    return session, RequestQueue(session, limit, lambda error: StoreError(str(error)))


def running(session: Session) -> list[str]:
    return [f.statement for f in session.started if not hasattr(f, "done")]


def finish(future: Future, rows, more: bool = False) -> None:
    if not more:
        future.done = True
    future.page(rows, more)


@pytest_twisted.ensureDeferred
async def test_at_most_limit_requests_run_across_groups_in_fifo_order():
    session, queue = queue_of(3)
    first = queue.run([(f"a{i}", ()) for i in range(4)], "profile")
    second = queue.run([("b0", ()), ("b1", ())], "profile")
    assert running(session) == ["a0", "a1", "a2"]
    finish(session.started[1], [("a1 row",)])
    assert running(session) == ["a0", "a2", "a3"]
    finish(session.started[0], [("a0 page 1",)], more=True)  # more pages: still in flight
    assert session.started[0].fetches == 1 and running(session) == ["a0", "a2", "a3"]
    finish(session.started[0], [("a0 page 2",)])
    assert running(session) == ["a2", "a3", "b0"]
    for future in session.started[2:4]:
        finish(future, [])
    assert running(session) == ["b0", "b1"]
    assert await first == [[("a0 page 1",), ("a0 page 2",)], [("a1 row",)], [], []]
    for future in session.started[4:]:
        finish(future, [(future.statement,)])
    assert await second == [[("b0",)], [("b1",)]]
    assert queue._inflight == 0


@pytest_twisted.ensureDeferred
async def test_the_first_failure_fails_its_group_once_its_running_requests_end():
    session, queue = queue_of(2)
    failing = queue.run([("a0", ()), ("a1", ()), ("a2", ()), ("a3", ())], "profile")
    other = queue.run([("b0", ())], "profile")
    session.started[0].fail(Exception("timeout"))
    # a1 still runs; a2 and a3 are skipped without being sent, which lets b0 start
    assert [f.statement for f in session.started] == ["a0", "a1", "b0"]
    assert not failing.called
    finish(session.started[1], [])
    with pytest.raises(StoreError, match="timeout"):
        await failing
    finish(session.started[2], [("b0",)])
    assert await other == [[("b0",)]]
    assert queue._inflight == 0


@pytest_twisted.ensureDeferred
async def test_a_request_the_driver_refuses_fails_the_group_and_frees_its_place():
    session, queue = queue_of(1)
    refused = queue.run([("refused", ()), ("a1", ())], "profile")
    with pytest.raises(StoreError, match="no host"):
        await refused
    assert session.started == [] and queue._inflight == 0
    assert await queue.run([], "profile") == []


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_failure_limit_refuses_past_its_allowance_and_refills_over_a_minute():
    from gateway.http.auth import FailureLimit
    from gateway.ingest.limits import RateLimited

    clock = FakeClock()
    limit = FailureLimit(6, clock=clock)
    for _ in range(6):
        limit.check("user a", "address x")
        limit.failed("user a", "address x")
    with pytest.raises(RateLimited) as refused:
        limit.check("user b", "address x")
    assert refused.value.retry_after_s == 10 and refused.value.limit == "auth_failures"
    limit.check("user b", "address y")  # other keys keep their allowance
    clock.now += 10  # one attempt back (6 a minute)
    limit.check("user a", "address x")
    limit.failed("user a")
    with pytest.raises(RateLimited):
        limit.check("user a")


def test_failure_limit_keeps_a_bounded_number_of_keys_and_zero_turns_it_off():
    from gateway.http.auth import FailureLimit
    from gateway.ingest.limits import RateLimited

    limit = FailureLimit(1, max_keys=3, clock=FakeClock())
    for user in "abcd":
        limit.failed(f"user {user}")
    limit.check("user a")  # the oldest key was forgotten: its allowance is whole again
    for user in "bcd":
        with pytest.raises(RateLimited):
            limit.check(f"user {user}")
    unlimited = FailureLimit(0, clock=FakeClock())
    for _ in range(100):
        unlimited.failed("user a")
        unlimited.check("user a")


def test_failure_limit_tells_which_keys_failed_lately():
    """Credentials hold an address to the user name's allowance only when it failed in the last
    SUSPECT_ADDRESS_S: after that it is a clean address again."""
    from gateway.http.auth import SUSPECT_ADDRESS_S, FailureLimit

    clock = FakeClock()
    limit = FailureLimit(6, clock=clock)
    assert not limit.failed_within("address x", SUSPECT_ADDRESS_S)
    limit.failed("address x")
    clock.now += SUSPECT_ADDRESS_S - 1
    assert limit.failed_within("address x", SUSPECT_ADDRESS_S)
    assert not limit.failed_within("address y", SUSPECT_ADDRESS_S)
    clock.now += 1
    assert not limit.failed_within("address x", SUSPECT_ADDRESS_S)


class PingedStore:
    """A store whose pings the test answers by hand."""

    def __init__(self):
        self.pings: list[defer.Deferred] = []

    def ping(self):
        self.pings.append(defer.Deferred())
        return self.pings[-1]


def ask(api: OpsAPI) -> list:
    """/healthz asked: a list that gets its answer, (status, document), or the error it raised."""
    answers: list = []

    def answered(outcome):
        if isinstance(outcome, Failure):
            answers.append(outcome.value)
        else:
            answers.append((outcome.status, json.loads(outcome.body)))

    defer.ensureDeferred(api.healthz(None)).addBoth(answered)
    return answers


def test_healthz_answers_by_its_deadline_whatever_the_store_does():
    """One ping at a time; a store that has not answered within HEALTHZ_DEADLINE_S reads as slow
    (200) until it has been silent for STORE_STALE_AFTER_S (503 "store slow"); a failed ping
    raises StoreUnavailable (the gateway's 503) until a ping answers again."""
    clock, store = task.Clock(), PingedStore()
    api = OpsAPI(store, clock)
    answers = ask(api)
    store.pings[0].callback(None)
    assert answers == [(200, {"status": "ok"})]

    clock.advance(10)
    answers = ask(api)
    clock.advance(HEALTHZ_DEADLINE_S - 0.01)
    assert answers == []  # waiting for the store
    clock.advance(0.01)
    assert answers == [(200, {"status": "ok", "store": "slow", "waiting_s": 0.5, "last_answer_s_ago": 10.5})]
    for _ in range(10):
        answers = ask(api)
        clock.advance(HEALTHZ_DEADLINE_S)
        assert answers[0][0] == 200 and answers[0][1]["store"] == "slow"
    assert len(store.pings) == 2  # the ping in flight is waited for, not sent again
    clock.advance(STORE_STALE_AFTER_S)
    answers = ask(api)
    clock.advance(HEALTHZ_DEADLINE_S)
    ((status, document),) = answers
    assert status == 503 and document["status"] == "store slow", document
    assert document["error"] == "the store has not answered a ping for 46.0 s"
    assert api.health._waiting == {}  # the requests that gave up are not kept
    for wait_s in (0, HEALTHZ_DEADLINE_S):  # a client that leaves: its answer is cancelled, nothing breaks
        gone = defer.ensureDeferred(api.healthz(None))
        gone.cancel()
        assert isinstance(gone.result.value, defer.CancelledError)
        gone.addErrback(lambda _: None)
        clock.advance(wait_s)

    answers = ask(api)
    store.pings[1].errback(StoreUnavailable("cassandra: no host"))
    (error,) = answers
    assert isinstance(error, StoreUnavailable) and str(error) == "store health check failed: cassandra: no host"
    answers = ask(api)
    clock.advance(HEALTHZ_DEADLINE_S)  # no answer yet: the last one failed
    assert isinstance(answers[0], StoreUnavailable)
    store.pings[2].callback(None)
    answers = ask(api)
    store.pings[3].callback(None)
    assert answers == [(200, {"status": "ok"})]
