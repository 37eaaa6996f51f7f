"""Compact rows for the SQLite file: records and transcript messages deflated with a dictionary.

A step's tool result is stored twice in the embedded file (the log's record and the transcript's
message), both JSON. :func:`pack` deflates a row against `DICTIONARY`, the JSON that every record
and message repeats (keys, kinds, nulls), so even a 200-byte record shrinks; a packed row starts
with `PACKED`, a byte no JSON text starts with. :func:`unpack` returns any other row as it is, so
rows written before packing, and a foreign writer's rows, read as they always did.

`DICTIONARY` is part of the file format: every packed row needs this exact one to be read back,
so it never changes. A better one would get a marker byte of its own.
"""

from __future__ import annotations

import zlib

PACKED = b"\x01"
"""The first byte of a packed row."""

DICTIONARY = (
    b'"error":null,"deadline":null,"response":null,"continuation_of":null,"carried":null,'
    b'"tool_call_id":null}"usage":{"input_tokens":,"output_tokens":}"idempotency_key":"onward-'
    b'"args":{"arguments":{"type":"tool_calls","tool_calls":[{"id":"call-"name":"'
    b'{"role":"user","content":"{"role":"tool","content":"{"role":"assistant","content":'
    b'"message":{"role":"assistant","content":"","tool_call_id":null},"tool_calls":[{"call_id":'
    b'"call-"iteration":"call_ids":["call-"result":"'
    b'{"kind":"run.started"{"kind":"run.finished"{"kind":"turn.settled"{"kind":"tool.dispatched"'
    b'{"kind":"tool.completed"{"kind":"model.answered"'
    b',"tenant":"","seq":,"fence":1,"at":17,"format":1,"run_id":"'
)
"""What deflate starts from: the JSON that records and messages repeat, most frequent last."""

_WINDOW_BITS = -12
"""A raw deflate stream (no header: `PACKED` marks it) with a 4 KB window: rows are small, and
a small window makes each row's compressor quick to set up."""

_MEMORY_LEVEL = 4
"""Deflate's hash table at a quarter of its default size: as small as a row needs, and quicker to
set up for each one."""

SMALLEST = 64
"""Rows shorter than this are stored as they are: too little to gain."""


def pack(row: bytes) -> bytes:
    """``row`` deflated and marked, or ``row`` itself when that would not be shorter."""
    if len(row) < SMALLEST:
        return row
    deflater = zlib.compressobj(1, zlib.DEFLATED, _WINDOW_BITS, _MEMORY_LEVEL, zdict=DICTIONARY)
    packed = PACKED + deflater.compress(row) + deflater.flush()
    return packed if len(packed) < len(row) else row


def unpack(stored: bytes) -> bytes:
    """The row :func:`pack` was given; a row that is not packed, as it is."""
    if not stored.startswith(PACKED):
        return stored
    inflater = zlib.decompressobj(_WINDOW_BITS, zdict=DICTIONARY)
    try:
        row = inflater.decompress(stored[1:]) + inflater.flush()
    except zlib.error:
        return stored  # not a packed row after all (a foreign writer's): left to the decoder
    # Whole and alone: a stream that ends early, or not at all, is not one `pack` wrote.
    return row if inflater.eof and not inflater.unused_data else stored
