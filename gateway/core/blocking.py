"""Where the blocking work of a request runs: SQLite calls, big decodes, evaluation, encoding.

In the serving process that is a thread, so that the reactor keeps serving other requests
meanwhile. A query executor (gateway/app/executor_process.py) serves one request at a time and
its reactor has nothing else to do, so there a thread only adds its hand-offs: the wake-up of the
reactor and the GIL passed back and forth, 0.2-0.3 ms a hop on a busy 2-core box, several hops a
query (2.3 ms of a 5.6 ms ``count()`` of 1,000 series). Such a process calls ``run_on_caller``
at start and the work runs on the calling thread, its Deferred already fired. A deadline still
holds there: the serving process kills an executor that overruns it.
"""

import threading
from collections.abc import Callable

from twisted.internet import defer, reactor, threads
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

_on_caller = False


def run_on_caller() -> None:
    """From now on, run blocking work on the calling thread: for a process whose reactor serves
    one request at a time and nothing else."""
    global _on_caller
    _on_caller = True


def in_thread(function: Callable, *args, **kwargs) -> defer.Deferred:
    """``function(*args, **kwargs)`` in the reactor's thread pool, or on the caller (``run_on_caller``)."""
    if _on_caller:
        return defer.maybeDeferred(function, *args, **kwargs)
    return threads.deferToThread(function, *args, **kwargs)


def in_pool(pool: ThreadPool, function: Callable, *args, **kwargs) -> defer.Deferred:
    """``function(*args, **kwargs)`` in ``pool``, or on the caller (``run_on_caller``)."""
    if _on_caller:
        return defer.maybeDeferred(function, *args, **kwargs)
    return threads.deferToThreadPool(reactor, pool, function, *args, **kwargs)


def in_daemon_thread(function: Callable, *args) -> defer.Deferred:
    """``function(*args)`` in a daemon thread of its own: for a close that may take longer than a
    stop allows (a driver's shutdown, a thread to join that is busy). The reactor joins the
    threads of its pool when it stops, so such work there would hold the process past its
    bound; this thread is not waited for."""
    done: defer.Deferred = defer.Deferred()

    def run() -> None:
        try:
            result = function(*args)
        except BaseException:
            reactor.callFromThread(done.errback, Failure())
        else:
            reactor.callFromThread(done.callback, result)

    threading.Thread(target=run, name=getattr(function, "__name__", "close"), daemon=True).start()
    return done
