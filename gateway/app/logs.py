"""Where every tsgate process (a command, a gateway worker, a query executor, an import worker)
sends its log lines: through the logging module to stderr, tagged with the process."""

import logging
import sys


class _NoDriverTracebacks(logging.Filter):
    """The Cassandra driver's log lines without their tracebacks: a node that refuses a
    connection is one line, not forty; and without Twisted's "Main loop terminated.", which
    every command would print as it exits. ``--log-level debug`` keeps everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("cassandra"):
            record.exc_info = record.exc_text = record.stack_info = None
        return not (record.name == "twisted" and record.getMessage() == "Main loop terminated.")


def setup_logging(level: str, process: str = "") -> None:
    """Everything, Twisted included, goes through the logging module to stderr.

    ``process`` (e.g. ``worker 1 pid 4242``) tags each line when several processes share stderr.
    """
    from twisted.logger import STDLibLogObserver, globalLogBeginner

    tag = f"[{process}] " if process else ""
    logging.basicConfig(stream=sys.stderr, level=level, format=f"%(asctime)s %(levelname)s {tag}%(name)s: %(message)s")
    if level != "DEBUG":
        for handler in logging.getLogger().handlers:
            handler.addFilter(_NoDriverTracebacks())
    globalLogBeginner.beginLoggingTo([STDLibLogObserver()], redirectStandardIO=False)
