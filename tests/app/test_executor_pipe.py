"""The pipe between the serving process and a query executor (gateway/app/executors.py): a message
is written when it is sent, not at the reactor's next turn, and arrives whole whatever its size."""

import os

import pytest
from twisted.internet import process, protocol, reactor

from gateway.app.executors import Frames, frame, send_now

pytestmark = pytest.mark.fast


class Side(protocol.Protocol):
    def childConnectionLost(self, fd, reason):  # noqa: N802 (Twisted's name)
        pass


@pytest.fixture
def pipe():
    """(read end, Twisted writer of the write end); both closed at the end."""
    read_end, write_end = os.pipe()
    writer = process.ProcessWriter(reactor, Side(), "write", write_end)
    yield read_end, writer
    writer.connectionLost(None)
    os.close(read_end)


def test_a_message_is_in_the_pipe_when_it_is_sent_without_a_turn_of_the_reactor(pipe):
    read_end, writer = pipe
    send_now(writer, frame(("answer", 200, "application/json", {}, b"{}")))
    assert Frames().feed(os.read(read_end, 1 << 16)) == [("answer", 200, "application/json", {}, b"{}")]


def test_what_the_pipe_does_not_take_at_once_waits_in_the_writer_and_a_closed_one_takes_nothing(pipe):
    read_end, writer = pipe
    body = os.urandom(1 << 20)  # over a pipe's 64 KiB
    send_now(writer, frame(("answer", 200, "application/json", {}, body)))
    frames, received = Frames(), []
    while not received:
        received = frames.feed(os.read(read_end, 1 << 16))
        writer.doWrite()  # what the reactor does each time the pipe has room again
    assert received == [("answer", 200, "application/json", {}, body)]
    send_now(None, b"gone")  # StandardIO's writer once the serving process closed the pipe
