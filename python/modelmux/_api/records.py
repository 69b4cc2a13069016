"""The records of a streamed handle call's result (`handle.options(stream=True)`): each item
the callee's generator makes is `tag (1 byte: v = value, e = exception) | length (u32,
big-endian) | pickle` in the response body, so items can be read while more are made."""

from __future__ import annotations

import struct

from modelmux._api.exceptions import RayServeException

_RECORD = struct.Struct(">cI")
VALUE = b"v"
EXCEPTION = b"e"


def record(tag: bytes, payload: bytes) -> bytes:
    """One item of a streamed result."""
    return _RECORD.pack(tag, len(payload)) + payload


class Records:
    """Splits a streamed result's bytes into its records."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Adds bytes; returns the records now complete, as (tag, pickle)."""
        buf = self._buf
        buf += data
        out: list[tuple[bytes, bytes]] = []
        offset = 0
        while len(buf) - offset >= _RECORD.size:
            tag, length = _RECORD.unpack_from(buf, offset)
            end = offset + _RECORD.size + length
            if len(buf) < end:
                break
            if tag not in (VALUE, EXCEPTION):
                raise RayServeException(f"a streamed result has a record of unknown kind {tag!r}")
            out.append((tag, bytes(buf[offset + _RECORD.size : end])))
            offset = end
        if offset:
            del buf[:offset]
        return out

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished record are left."""
        return bool(self._buf)
