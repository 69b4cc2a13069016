"""Framing of the worker protocol (docs/python-worker-protocol.md).

Every frame, both ways::

    u32 length (big-endian: the bytes after this field, 9 + head_len + data length)
    u8  type
    u32 stream
    u32 head_len
    head (UTF-8 JSON object, or nothing when head_len is 0)
    data (raw bytes)
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

# Rust -> worker.
REQUEST = 1
REQUEST_BODY = 2
REQUEST_END = 3
CANCEL = 4
CONTROL = 5
CALL_RESULT = 7
CALL_RESULT_BODY = 8
CALL_RESULT_END = 9
CREDIT = 10
# Worker -> Rust.
READY = 16
FATAL = 17
START = 18
BODY = 19
END = 20
ERROR = 21
REPLY = 22
CALL = 23
ACQUIRE = 24
CALL_BODY = 25
CALL_END = 26
CALL_CANCEL = 27

INBOUND_TYPES = frozenset(
    {
        REQUEST,
        REQUEST_BODY,
        REQUEST_END,
        CANCEL,
        CONTROL,
        CALL_RESULT,
        CALL_RESULT_BODY,
        CALL_RESULT_END,
        CREDIT,
    }
)

MAX_FRAME = 16 * 1024 * 1024
"""The largest `length` a frame may have."""
MAX_CHUNK = 1024 * 1024
"""The largest body chunk one frame carries."""
RESPONSE_WINDOW = 1024 * 1024
"""Bytes of one streamed response the worker sends beyond what modelmux has credited back
(`CREDIT` frames, as the response's reader takes them): a slow reader stalls its own stream
only, never the connection's others."""

_PREFIX = struct.Struct(">IBII")
PREFIX_LEN = _PREFIX.size  # 13: length, type, stream, head_len
_AFTER_LENGTH = 9  # type, stream and head_len, counted in `length`


class ProtocolError(Exception):
    """The peer broke the protocol: the connection must be closed."""


@dataclass(slots=True)
class Frame:
    """One decoded frame."""

    type: int
    stream: int
    head: dict[str, Any] | None
    data: bytes


def encode_head(head: dict[str, Any] | None) -> bytes:
    """The head's bytes: compact UTF-8 JSON, or nothing for no head."""
    if head is None:
        return b""
    return json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()


def encode_prefix(type_: int, stream: int, head: bytes, data_len: int) -> bytes:
    """The fixed prefix and the head of a frame whose data (of `data_len` bytes) follows."""
    length = _AFTER_LENGTH + len(head) + data_len
    if length > MAX_FRAME:
        raise ValueError(f"a frame of {length} bytes is over the protocol's {MAX_FRAME}-byte limit")
    return _PREFIX.pack(length, type_, stream, len(head)) + head


def encode(type_: int, stream: int, head: dict[str, Any] | None = None, data: bytes = b"") -> bytes:
    """One whole frame."""
    return encode_prefix(type_, stream, encode_head(head), len(data)) + data


class Decoder:
    """Splits a byte stream into frames of the types `accepted`."""

    def __init__(self, accepted: frozenset[int]) -> None:
        self._buf = bytearray()
        self._accepted = accepted

    def feed(self, data: bytes) -> list[Frame]:
        """Adds bytes; returns the frames now complete. Raises `ProtocolError` on a bad frame."""
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        offset = 0
        end = len(buf)
        while end - offset >= PREFIX_LEN:
            length, type_, stream, head_len = _PREFIX.unpack_from(buf, offset)
            if length > MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes is over the {MAX_FRAME}-byte limit")
            if length < _AFTER_LENGTH + head_len:
                raise ProtocolError(f"frame length {length} is shorter than its head ({head_len})")
            if type_ not in self._accepted:
                raise ProtocolError(f"unknown frame type {type_}")
            total = 4 + length
            if end - offset < total:
                break
            head_start = offset + PREFIX_LEN
            data_start = head_start + head_len
            head = None
            if head_len:
                try:
                    head = json.loads(bytes(buf[head_start:data_start]))
                except (UnicodeDecodeError, ValueError) as e:
                    raise ProtocolError(f"malformed frame head: {e}") from None
                if not isinstance(head, dict):
                    raise ProtocolError("a frame head must be a JSON object")
            frames.append(Frame(type_, stream, head, bytes(buf[data_start : offset + total])))
            offset += total
        if offset:
            del buf[:offset]
        return frames
