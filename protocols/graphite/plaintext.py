"""Carbon's plaintext line protocol: ``path value timestamp\\n`` over TCP or UDP.

Rules follow carbon's MetricLineReceiver (exactly three whitespace-separated
fields, value and timestamp through float()); limits and the differences from
carbon are listed in docs/graphite.rst (Wire formats).
"""

from protocols.graphite import (
    BAD_FIELD_COUNT,
    BAD_UTF8,
    EXCERPT_LENGTH,
    LINE_TOO_LONG,
    TRUNCATED_LINE,
    InvalidInput,
    Reject,
    Sample,
    excerpt,
    parse_timestamp_ms,
    parse_value,
)
from protocols.graphite.tags import parse_path

# Twisted's LineOnlyReceiver.MAX_LENGTH, which carbon's line receiver keeps.
DEFAULT_MAX_LINE_LENGTH = 16384


class PlaintextDecoder:
    """Incremental decoder for one TCP connection: TCP reads split lines anywhere.

    At most ``max_line_length`` bytes (newline excluded) of an unfinished line
    are kept; a longer line is rejected once and then skipped up to its newline
    without being buffered.
    """

    def __init__(self, max_line_length: int = DEFAULT_MAX_LINE_LENGTH) -> None:
        self.max_line_length = max_line_length
        self._partial = b""
        self._discarding = False

    def feed(self, data: bytes, now_ms: int) -> tuple[list[Sample], list[Reject]]:
        samples: list[Sample] = []
        rejects: list[Reject] = []
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return samples, rejects
            self._discarding = False
            data = data[newline + 1 :]
        lines = data.split(b"\n")
        tail = lines.pop()
        if lines and self._partial:
            lines[0] = self._partial + lines[0]
            self._partial = b""
        decode_lines(lines, now_ms, self.max_line_length, samples, rejects)
        if len(self._partial) + len(tail) > self.max_line_length:
            rejects.append(Reject(LINE_TOO_LONG, excerpt(self._partial + tail[:EXCERPT_LENGTH])))
            self._partial = b""
            self._discarding = True
        else:
            self._partial += tail
        return samples, rejects

    def finish(self) -> list[Reject]:
        """Connection closed: an unterminated last line is rejected, never decoded.

        Carbon (Twisted's LineOnlyReceiver) silently drops it too; decoding it
        could store a value or timestamp cut short by a broken connection.
        """
        rejects = []
        if self._partial.strip():
            rejects.append(Reject(TRUNCATED_LINE, excerpt(self._partial)))
        self._partial = b""
        self._discarding = False
        return rejects


def decode_datagram(
    data: bytes,
    now_ms: int,
    max_line_length: int = DEFAULT_MAX_LINE_LENGTH,
) -> tuple[list[Sample], list[Reject]]:
    """One UDP datagram: it holds whole lines, so a last line without newline is decoded too."""
    samples: list[Sample] = []
    rejects: list[Reject] = []
    decode_lines(data.split(b"\n"), now_ms, max_line_length, samples, rejects)
    return samples, rejects


def decode_lines(
    lines: list[bytes],
    now_ms: int,
    max_line_length: int,
    samples: list[Sample],
    rejects: list[Reject],
) -> None:
    """Decode complete lines (newline already removed) into the given lists.

    bytes.split() with no argument splits on ASCII whitespace, which also
    removes a trailing '\\r'; blank lines are skipped silently like carbon does.
    """
    append_sample = samples.append
    for line in lines:
        if len(line) > max_line_length:
            rejects.append(Reject(LINE_TOO_LONG, excerpt(line)))
            continue
        fields = line.split()
        if len(fields) != 3:
            if fields:
                rejects.append(Reject(BAD_FIELD_COUNT, excerpt(line)))
            continue
        raw_path, raw_value, raw_timestamp = fields
        try:
            name, tags = parse_path(raw_path.decode())
            value = parse_value(raw_value)
            append_sample((name, tags, parse_timestamp_ms(raw_timestamp, now_ms), value))
        except UnicodeDecodeError:
            rejects.append(Reject(BAD_UTF8, excerpt(raw_path)))
        except InvalidInput as error:
            rejects.append(error.reject())
