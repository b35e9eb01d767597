"""Single-pass chunked scan machinery: tickets and decoupled look-back (paper 003 §3; Merrill & Garland).

Every program of a scan kernel takes a *ticket* from an atomic counter; ticket order is chunk-major
(all lane tiles of chunk 0 first, then chunk 1, ...), so a program only ever waits for programs that
hold lower tickets, which are already running: no deadlock, whatever order the GPU starts programs in.

A program scans its chunk in registers, publishes the chunk's *aggregate* (the composed coefficient
``A`` and the partial result ``Y`` with a zero carry-in), then walks back over its predecessors'
records, composing aggregates until it meets an *inclusive* value (the true state at the end of
that chunk), and finally publishes its own inclusive value.

Records live in a zeroed int64 workspace, one word per value and lane, every word **written once**:
bit 32 says "published", the low 32 bits hold the float32 value, so a value and its flag become
visible together, and a word once seen published never changes (the aggregate and the inclusive
value have separate words). Layout per (lane tile, chunk): ``NA`` aggregate-coefficient words, ``NV``
aggregate-value words, ``NV`` inclusive-value words, each a row of ``BD`` lanes.

Replicated lanes. When a program has more threads than its ``[BD]`` row has elements, Triton gives
each lane to several threads ("replicas"), which load the records independently and may see a word
at different moments; a reduction over the row (the loop's exit test) may then combine only one
replica's view. The first version let each replica decide alone: a replica that saw a
predecessor's aggregate while its twin saw the inclusive value left the loop with an incomplete carry
(wrong outputs about once in a few launches on an H200). Here every loaded word goes through
``agree`` (the maximum over all threads that hold the lane: an unpublished word is 0, a published one
its single final value), so all replicas take the same decisions on the same values, and the chunk
index ``j`` is one scalar for the whole program (no per-lane addresses).
"""

from __future__ import annotations

import triton
import triton.language as tl

PUBLISHED = tl.constexpr(1)


@triton.jit
def pack(value):
    """float32 ``value`` as a published int64 word (bit 32 set)."""
    bits = value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return bits | (PUBLISHED << 32)


@triton.jit
def unpack(word):
    """``(value float32, published bool)`` of a word written by ``pack`` (or still 0)."""
    value = (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    return value, (word >> 32) == PUBLISHED


@triton.jit
def agree(word, CH: tl.constexpr, BD: tl.constexpr):
    """The same ``[BD]`` word in every thread that holds a lane: the maximum over all threads'
    loads, through a reduction of the row broadcast over the ``[CH, BD]`` tile (0 if none saw it)."""
    return tl.max(tl.broadcast_to(word[None, :], (CH, BD)), axis=0)


@triton.jit
def load_word(ptr, CH: tl.constexpr, BD: tl.constexpr):
    """Volatile load of a ``[BD]`` row of record words, agreed over replicas (see ``agree``)."""
    return unpack(agree(tl.load(ptr, volatile=True), CH, BD))


@triton.jit
def take_ticket(counter_ptr, n_lane_tiles):
    """``(chunk index in scan order, lane tile)`` for this program, chunk-major."""
    ticket = tl.atomic_add(counter_ptr, 1)
    return ticket // n_lane_tiles, ticket % n_lane_tiles


@triton.jit
def lookback_diag(rec, k, agg_a, agg_y, CH: tl.constexpr, BD: tl.constexpr):
    """Carry-in ``[BD]`` of chunk ``k`` (scan order) of the diagonal scan; publishes its records.

    ``rec``: pointer row ``[BD]`` to chunk 0's record of this lane tile (records ``3 * BD`` words
    apart: ``A``, aggregate ``Y``, inclusive ``Y``); ``agg_a, agg_y [BD]``: this chunk's aggregate.
    """
    carry = tl.zeros([BD], dtype=tl.float32)
    if k > 0:
        here = rec + k * 3 * BD
        tl.store(here, pack(agg_a))
        tl.store(here + BD, pack(agg_y))
        j = k - 1
        prod = tl.full([BD], 1.0, tl.float32)
        done = tl.zeros([BD], dtype=tl.int32)
        while tl.min(done) == 0:
            there = rec + j * 3 * BD
            vi, inc = load_word(there + 2 * BD, CH, BD)
            va, fa = load_word(there, CH, BD)
            vy, fy = load_word(there + BD, CH, BD)
            live = done == 0
            ready = (~live) | inc | (fa & fy)
            go = tl.min(ready.to(tl.int32)) == 1  # every live lane can take chunk j: step together
            use_inc = live & inc & go
            use_agg = live & (~inc) & go
            carry = tl.where(use_inc, carry + prod * vi, tl.where(use_agg, carry + prod * vy, carry))
            prod = tl.where(use_agg, prod * va, prod)
            done = tl.where(use_inc, 1, done)
            j = tl.where(go, j - 1, j)
    tl.store(rec + k * 3 * BD + 2 * BD, pack(agg_y + agg_a * carry))
    return carry


@triton.jit
def lookback_block2(rec, k, g00, g01, g10, g11, gy0, gy1, CH: tl.constexpr, BD: tl.constexpr):
    """Carry-in ``(r0, r1)`` of chunk ``k`` of the 2x2-block scan; publishes its records.

    Records ``8 * BD`` words apart: ``A00, A01, A10, A11``, aggregate ``Y0, Y1``, inclusive ``Y0, Y1``.
    """
    r0 = tl.zeros([BD], dtype=tl.float32)
    r1 = tl.zeros([BD], dtype=tl.float32)
    if k > 0:
        here = rec + k * 8 * BD
        tl.store(here, pack(g00))
        tl.store(here + BD, pack(g01))
        tl.store(here + 2 * BD, pack(g10))
        tl.store(here + 3 * BD, pack(g11))
        tl.store(here + 4 * BD, pack(gy0))
        tl.store(here + 5 * BD, pack(gy1))
        j = k - 1
        # running product P (2x2) of the coefficients between chunk j and us; carry += P @ value
        p00 = tl.full([BD], 1.0, tl.float32)
        p01 = tl.zeros([BD], dtype=tl.float32)
        p10 = tl.zeros([BD], dtype=tl.float32)
        p11 = tl.full([BD], 1.0, tl.float32)
        done = tl.zeros([BD], dtype=tl.int32)
        while tl.min(done) == 0:
            there = rec + j * 8 * BD
            i0, e0 = load_word(there + 6 * BD, CH, BD)
            i1, e1 = load_word(there + 7 * BD, CH, BD)
            q00, f00 = load_word(there, CH, BD)
            q01, f01 = load_word(there + BD, CH, BD)
            q10, f10 = load_word(there + 2 * BD, CH, BD)
            q11, f11 = load_word(there + 3 * BD, CH, BD)
            v0, h0 = load_word(there + 4 * BD, CH, BD)
            v1, h1 = load_word(there + 5 * BD, CH, BD)
            live = done == 0
            inc = e0 & e1
            agg = f00 & f01 & f10 & f11 & h0 & h1
            go = tl.min(((~live) | inc | agg).to(tl.int32)) == 1
            use_inc = live & inc & go
            use_agg = live & (~inc) & go
            w0 = tl.where(use_inc, i0, v0)
            w1 = tl.where(use_inc, i1, v1)
            use = use_inc | use_agg
            r0 = tl.where(use, r0 + p00 * w0 + p01 * w1, r0)
            r1 = tl.where(use, r1 + p10 * w0 + p11 * w1, r1)
            n00 = p00 * q00 + p01 * q10
            n01 = p00 * q01 + p01 * q11
            n10 = p10 * q00 + p11 * q10
            n11 = p10 * q01 + p11 * q11
            p00 = tl.where(use_agg, n00, p00)
            p01 = tl.where(use_agg, n01, p01)
            p10 = tl.where(use_agg, n10, p10)
            p11 = tl.where(use_agg, n11, p11)
            done = tl.where(use_inc, 1, done)
            j = tl.where(go, j - 1, j)
    here = rec + k * 8 * BD
    tl.store(here + 6 * BD, pack(gy0 + g00 * r0 + g01 * r1))
    tl.store(here + 7 * BD, pack(gy1 + g10 * r0 + g11 * r1))
    return r0, r1
