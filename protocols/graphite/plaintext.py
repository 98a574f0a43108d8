"""Carbon's plaintext line protocol: ``path value timestamp\\n`` over TCP or UDP.

Rules follow carbon's MetricLineReceiver (exactly three whitespace-separated
fields, value and timestamp through float()); limits and the differences from
carbon are listed in docs/graphite.rst (Wire formats).
"""

from itertools import compress

import numpy as np

from protocols.graphite import (
    BAD_FIELD_COUNT,
    EXCERPT_LENGTH,
    LINE_TOO_LONG,
    TRUNCATED_LINE,
    InvalidInput,
    Reject,
    excerpt,
    parse_timestamp_ms,
    parse_value,
)
from protocols.graphite.arrays import Samples, decode_points, no_samples, path_series

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

    def feed(self, data: bytes, now_ms: int) -> tuple[Samples, list[Reject]]:
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return no_samples(), []
            self._discarding = False
            data = data[newline + 1 :]
        lines = data.split(b"\n")
        tail = lines.pop()
        if lines and self._partial:
            lines[0] = self._partial + lines[0]
            self._partial = b""
        samples, rejects = decode_lines(lines, now_ms, self.max_line_length)
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
) -> tuple[Samples, list[Reject]]:
    """One UDP datagram: it holds whole lines, so a last line without newline is decoded too."""
    return decode_lines(data.split(b"\n"), now_ms, max_line_length)


def decode_lines(lines: list[bytes], now_ms: int, max_line_length: int) -> tuple[Samples, list[Reject]]:
    """Decode complete lines (newline already removed) into arrays, and the rejects in line order.

    bytes.split() with no argument splits on ASCII whitespace, which also
    removes a trailing '\\r'; blank lines are skipped silently like carbon does.
    Lines of three fields are decoded in bulk (protocols.graphite.arrays); each
    refused line is then decoded alone to name its reject.
    """
    fields = list(map(bytes.split, lines))
    counts = np.fromiter(map(len, fields), dtype=np.intp, count=len(lines))
    too_long = np.fromiter(map(len, lines), dtype=np.intp, count=len(lines)) > max_line_length
    shaped = (counts == 3) & ~too_long
    positions = np.flatnonzero(shaped)
    columns = zip(*compress(fields, shaped.tolist())) if len(positions) else ((), (), ())
    raw_paths, raw_values, raw_timestamps = columns
    samples, bad = decode_points(raw_paths, raw_timestamps, raw_values, now_ms)
    refused = np.flatnonzero(~shaped & (too_long | (counts != 0))).tolist() + positions[bad].tolist()
    refused.sort()
    return samples, [_reject(lines[position], now_ms, max_line_length) for position in refused]


def _reject(line: bytes, now_ms: int, max_line_length: int) -> Reject:
    """Why a refused line is refused, with the first failing check (carbon's order)."""
    if len(line) > max_line_length:
        return Reject(LINE_TOO_LONG, excerpt(line))
    fields = line.split()
    if len(fields) != 3:
        return Reject(BAD_FIELD_COUNT, excerpt(line))
    raw_path, raw_value, raw_timestamp = fields
    try:
        path_series(raw_path)
        parse_value(raw_value)
        parse_timestamp_ms(raw_timestamp, now_ms)
    except InvalidInput as error:
        return error.reject()
    raise ValueError(f"line {excerpt(line)} was refused in bulk but decodes alone")
