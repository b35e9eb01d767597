"""Single-pass chunked scan machinery: tickets and decoupled look-back (paper 003 §3; Merrill & Garland).

Every program of a scan kernel takes a *ticket* from an atomic counter; ticket order is chunk-major
(all lane tiles of chunk 0 first, then chunk 1, ...), so a program only ever waits for programs that
hold lower tickets, which are already running: no deadlock, whatever order the GPU starts programs in.

A program scans its chunk in registers, publishes the chunk's *aggregate* (the composed coefficient
``A`` and the partial result ``Y`` with a zero carry-in), then walks back over its predecessors'
records, composing aggregates until it meets an *inclusive* value (the true state at the end of
that chunk), and finally publishes its own inclusive value. Records live in a zeroed int64
workspace, one word per value and lane; the high 32 bits of a word are its flag
(0 = not yet written, 1 = aggregate, 2 = inclusive), the low 32 bits the float32 value, so a value
and its flag always become visible together (no fence or ordering between words is needed).

Workspace layout per (lane tile, chunk): ``NA`` aggregate-coefficient words then ``NV`` value words,
each a row of ``BD`` lanes. The value words hold the aggregate ``Y`` (flag 1) and are overwritten
by the inclusive value (flag 2).
"""

from __future__ import annotations

import triton
import triton.language as tl

FLAG_AGG = tl.constexpr(1)
FLAG_INC = tl.constexpr(2)


@triton.jit
def pack(value, flag: tl.constexpr):
    """float32 ``value`` and a flag in one int64 word."""
    bits = value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return bits | (flag << 32)


@triton.jit
def unpack(word):
    """``(value float32, flag int64)`` of a word written by ``pack``."""
    value = (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    return value, word >> 32


@triton.jit
def take_ticket(counter_ptr, n_lane_tiles):
    """``(chunk index in scan order, lane tile)`` for this program, chunk-major."""
    ticket = tl.atomic_add(counter_ptr, 1)
    return ticket // n_lane_tiles, ticket % n_lane_tiles
