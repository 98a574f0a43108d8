"""Carbon's pickle protocol: frames of a 4-byte big-endian length plus a pickle.

The payload is a list of ``(path, (timestamp, value))`` (lists accepted in
place of tuples). Pickle is a program, not data, so a frame passes two gates
before anything is built: an opcode allowlist (data opcodes only, bounded memo
indices) and an Unpickler whose find_class refuses every global.
"""

import io
import pickle
import pickletools
from itertools import compress
from typing import NoReturn

import numpy as np

from protocols.graphite import (
    BAD_PICKLE,
    BAD_PICKLE_ITEM,
    FRAME_TOO_LARGE,
    TOO_MANY_ITEMS,
    TRUNCATED_FRAME,
    InvalidInput,
    Reject,
    excerpt,
    parse_timestamp_ms,
    parse_value,
)
from protocols.graphite.arrays import Samples, concat, decode_points, no_samples, path_series

# carbon's PICKLE_RECEIVER_MAX_LENGTH default.
DEFAULT_MAX_FRAME_BYTES = 1 << 20

HEADER_BYTES = 4

# The smallest item a pickler writes: a memoized path (BINGET), two one-byte ints, two TUPLE2.
# A frame holding more items than its bytes allow at this size repeats objects (DUP, GET): 1 MB
# of DUP opcodes would otherwise become a million samples.
MIN_ITEM_BYTES = 8

# Opcodes that build only None, bools, ints, floats, str, bytes, lists and
# tuples, plus the stack, memo and framing machinery. Everything able to
# reach a callable or an attribute (GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
# INST, OBJ, NEWOBJ*, EXT*, PERSID*) and everything unneeded (dicts, sets,
# bytearrays, out-of-band buffers) is refused.
ALLOWED_OPCODES = frozenset(
    {
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "LIST",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
        "MEMOIZE",
        "GET",
        "BINGET",
        "LONG_BINGET",
    }
)

# Argument layouts in the scan table: a value >= 0 is a fixed argument size;
# _COUNTED - w is a w-byte little-endian length followed by that many bytes.
_TEXT_LINE = -1
_STOP = -2
_PUT = -3
_LONG_BINPUT = -4
_COUNTED = -10
_COUNT_WIDTH = {
    pickletools.TAKEN_FROM_ARGUMENT1: 1,
    pickletools.TAKEN_FROM_ARGUMENT4: 4,
    pickletools.TAKEN_FROM_ARGUMENT4U: 4,
    pickletools.TAKEN_FROM_ARGUMENT8U: 8,
}


def _scan_table() -> tuple[list, dict[int, str]]:
    """Per opcode byte: its argument layout (None if refused), and its name for error details."""
    layouts: list = [None] * 256
    names = {}
    special = {"STOP": _STOP, "PUT": _PUT, "LONG_BINPUT": _LONG_BINPUT}
    for opcode in pickletools.opcodes:
        code = ord(opcode.code)
        names[code] = opcode.name
        if opcode.name not in ALLOWED_OPCODES:
            continue
        if opcode.name in special:
            layouts[code] = special[opcode.name]
        elif opcode.arg is None:
            layouts[code] = 0
        elif opcode.arg.n == pickletools.UP_TO_NEWLINE:
            layouts[code] = _TEXT_LINE
        elif opcode.arg.n in _COUNT_WIDTH:
            layouts[code] = _COUNTED - _COUNT_WIDTH[opcode.arg.n]
        else:
            layouts[code] = opcode.arg.n
    return layouts, names


_LAYOUTS, _OPCODE_NAMES = _scan_table()


class NoGlobalsUnpickler(pickle.Unpickler):
    """Second gate: even if a global got past the opcode scan, nothing is ever imported."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"global {module[:40]}.{name[:40]} refused")


class PickleDecoder:
    """Incremental decoder for one pickle connection: TCP reads split frames anywhere.

    A frame longer than ``max_frame_bytes`` is rejected and its bytes are
    dropped as they arrive, so the connection goes on with the next frame.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._skip = 0

    def feed(self, data: bytes | memoryview, now_ms: int) -> tuple[Samples, list[Reject]]:
        samples: list[Samples] = []
        rejects: list[Reject] = []
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = memoryview(data)[skipped:]
        buffer = self._buffer
        buffer += data
        start = 0
        with memoryview(buffer) as view:
            while len(buffer) - start >= HEADER_BYTES:
                size = int.from_bytes(view[start : start + HEADER_BYTES], "big")
                available = len(buffer) - start - HEADER_BYTES
                if size > self.max_frame_bytes:
                    detail = f"{size} bytes, limit {self.max_frame_bytes}"
                    rejects.append(Reject(FRAME_TOO_LARGE, detail))
                    skipped = min(size, available)
                    self._skip = size - skipped
                    start += HEADER_BYTES + skipped
                elif size <= available:
                    payload = bytes(view[start + HEADER_BYTES : start + HEADER_BYTES + size])
                    start += HEADER_BYTES + size
                    frame_samples, frame_rejects = decode_frame(payload, now_ms)
                    samples.append(frame_samples)
                    rejects += frame_rejects
                else:
                    break
        del buffer[:start]
        return concat(samples), rejects

    def finish(self) -> list[Reject]:
        """Connection closed: a partly received frame is rejected (carbon drops it silently).

        An oversized frame still being skipped was already rejected when its header arrived.
        """
        rejects = []
        if self._buffer:
            detail = f"{len(self._buffer)} bytes of an unfinished frame"
            rejects.append(Reject(TRUNCATED_FRAME, detail))
        self._buffer.clear()
        self._skip = 0
        return rejects


def decode_frame(payload: bytes, now_ms: int) -> tuple[Samples, list[Reject]]:
    """Decode one frame's pickle: a bad pickle is one reject, a bad item one reject each."""
    try:
        check_opcodes(payload)
        items = NoGlobalsUnpickler(io.BytesIO(payload), encoding="bytes").load()
    except InvalidInput as error:
        return no_samples(), [error.reject()]
    except Exception as error:  # the unpickler can raise nearly anything on hostile input
        return no_samples(), [Reject(BAD_PICKLE, f"{type(error).__name__}: {str(error)[:200]}")]
    if type(items) not in (list, tuple):
        return no_samples(), [Reject(BAD_PICKLE, f"payload is a {type(items).__name__}, not a list")]
    if len(items) > len(payload) // MIN_ITEM_BYTES:
        detail = f"{len(items)} items in {len(payload)} bytes, at most one per {MIN_ITEM_BYTES} bytes"
        return no_samples(), [Reject(TOO_MANY_ITEMS, detail)]
    shaped = np.fromiter(map(_shaped, items), dtype=bool, count=len(items))
    positions = np.flatnonzero(shaped)
    paths, points = zip(*compress(items, shaped.tolist())) if len(positions) else ((), ())
    timestamps, values = zip(*points) if points else ((), ())
    samples, bad = decode_points(paths, timestamps, values, now_ms)
    refused = np.flatnonzero(~shaped).tolist() + positions[bad].tolist()
    refused.sort()
    return samples, [_reject(items[position], now_ms) for position in refused]


def check_opcodes(payload: bytes) -> None:
    """First gate: walk the opcodes without building anything; raise InvalidInput on a refused one.

    It also bounds memo indices: CPython's unpickler grows its memo array to
    twice the largest index it is asked to store, so a 9-byte pickle with
    LONG_BINPUT 2**27 would allocate and clear 2 GiB. A real pickle stores at
    most one memo entry per opcode, so indices beyond the payload length are refused.
    """
    layouts = _LAYOUTS
    from_bytes = int.from_bytes
    end = len(payload)
    position = 0
    while position < end:
        layout = layouts[payload[position]]
        position += 1
        if layout is None:
            code = payload[position - 1]
            name = _OPCODE_NAMES.get(code, f"byte 0x{code:02x}")
            raise InvalidInput(BAD_PICKLE, f"opcode {name} not allowed at offset {position - 1}")
        if layout >= 0:
            position += layout
        elif layout <= _COUNTED:
            width = _COUNTED - layout
            position += width + from_bytes(payload[position : position + width], "little")
        elif layout == _TEXT_LINE or layout == _PUT:
            newline = payload.find(b"\n", position)
            if newline < 0:
                break
            if layout == _PUT:
                _check_memo_index(payload[position:newline], end)
            position = newline + 1
        elif layout == _LONG_BINPUT:
            _check_memo_index(from_bytes(payload[position : position + 4], "little"), end)
            position += 4
        else:  # STOP
            if position != end:
                raise InvalidInput(BAD_PICKLE, f"{end - position} bytes after STOP")
            return
    raise InvalidInput(BAD_PICKLE, "pickle truncated (no STOP)")


def _check_memo_index(raw: bytes | int, payload_length: int) -> None:
    try:
        index = int(raw)
    except ValueError:
        raise InvalidInput(BAD_PICKLE, "bad memo index " + excerpt(raw)) from None
    if index >= payload_length:
        raise InvalidInput(BAD_PICKLE, f"memo index {index} beyond payload length {payload_length}")


_PAIRS = (tuple, list)
_TEXT = (str, bytes)


def _shaped(item: object) -> bool:
    """An item decode_points takes: (path, (timestamp, value)) with a text path."""
    return (
        type(item) in _PAIRS
        and len(item) == 2  # type: ignore[arg-type]
        and type(item[0]) in _TEXT  # type: ignore[index]
        and type(item[1]) in _PAIRS  # type: ignore[index]
        and len(item[1]) == 2  # type: ignore[index]
    )


def _reject(item: object, now_ms: int) -> Reject:
    """Why a refused item is refused, with the first failing check."""
    try:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidInput(BAD_PICKLE_ITEM, "not (path, (timestamp, value)): " + excerpt(item))
        raw_path, point = item
        if not isinstance(point, (tuple, list)) or len(point) != 2:
            raise InvalidInput(BAD_PICKLE_ITEM, "not (timestamp, value): " + excerpt(point))
        path_series(raw_path)
        raw_timestamp, raw_value = point
        parse_value(raw_value)
        parse_timestamp_ms(raw_timestamp, now_ms)
    except InvalidInput as error:
        return error.reject()
    raise ValueError(f"item {excerpt(item)} was refused in bulk but decodes alone")
