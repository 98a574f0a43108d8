"""Blocking work runs in a thread, or on the caller in a process that serves one request at a time."""

import threading

import pytest
import pytest_twisted
from twisted.python.threadpool import ThreadPool

from gateway.core import blocking


@pytest.fixture
def on_caller(monkeypatch):
    monkeypatch.setattr(blocking, "_on_caller", False)
    blocking.run_on_caller()


@pytest.fixture
def pool():
    threads = ThreadPool(1, 1, name="test-blocking")
    threads.start()
    yield threads
    threads.stop()


def where(value):
    return value, threading.get_ident()


def refuse(value):
    raise ValueError(value)


@pytest_twisted.ensureDeferred
async def test_by_default_the_work_runs_in_a_thread_off_the_reactor(monkeypatch, pool):
    monkeypatch.setattr(blocking, "_on_caller", False)
    assert (await blocking.in_thread(where, 1))[1] != threading.get_ident()
    assert (await blocking.in_pool(pool, where, 2))[1] != threading.get_ident()


def test_on_the_caller_the_work_has_run_when_the_deferred_is_given(on_caller, pool):
    for deferred in (blocking.in_thread(where, 1), blocking.in_pool(pool, where, 2)):
        assert deferred.called
        assert deferred.result[1] == threading.get_ident()
        deferred.addCallback(lambda _: None)


def test_on_the_caller_an_error_is_the_deferred_s_failure_not_raised(on_caller):
    failures = []
    blocking.in_thread(refuse, "no").addErrback(failures.append)
    assert failures and failures[0].check(ValueError) and str(failures[0].value) == "no"


@pytest_twisted.ensureDeferred
async def test_a_daemon_thread_runs_the_work_and_its_error_is_the_deferred_s_failure():
    """Not one of the reactor's pool, which the reactor joins when it stops."""
    thread = await blocking.in_daemon_thread(threading.current_thread)
    assert thread.daemon and thread is not threading.current_thread()
    with pytest.raises(ValueError, match="late"):
        await blocking.in_daemon_thread(refuse, "late")
