"""Single-pass chunked scan machinery: tickets and decoupled look-back (paper 003 §3; Merrill & Garland).

Every program of a scan kernel takes a *ticket* from an atomic counter; ticket order is chunk-major
(all lane tiles of chunk 0 first, then chunk 1, ...), so a program only ever waits for programs that
hold lower tickets, which are already running: no deadlock, whatever order the GPU starts programs in.

A program scans its chunk in registers, publishes the chunk's *aggregate* (the composed coefficient
``A`` and the partial result ``Y`` with a zero carry-in), then walks back over its predecessors'
records, composing aggregates until it meets an *inclusive* value (the true state at the end of
that chunk), and finally publishes its own inclusive value.

Workspace (int64, cached across launches by ``triton_ops._workspace``): word 0 is the ticket counter,
``epoch << 32 | tickets taken``; the program that takes the launch's last ticket sets it to
``(epoch + 1) << 32``, so the next launch on the stream starts at ticket 0 with the next epoch, and no
host-side reset (or zeroing) is needed between launches. Every record word is **written once per
launch**: bits 32-62 hold the launch's *tag* ``epoch + 1`` (never 0, so a zeroed workspace holds no
published word), the low 32 bits the float32 value, so a value and its flag become visible together;
a word from an earlier launch carries an older tag and reads as unpublished. The records start at
word ``RECORDS_OFFSET`` (``records``), one per (lane tile, chunk): ``NA`` aggregate-coefficient words,
``NV`` aggregate-value words, ``NV`` inclusive-value words, each a row of ``BD`` lanes. (Tags repeat
after ``2**31 - 1`` launches; ``triton_ops`` zeroes the workspace before that.)

Replicated lanes. When a program has more threads than its ``[BD]`` rows have elements, Triton gives
each lane to several threads ("replicas"), which load the records independently and may see a word
at different moments, and a reduction over a ``[BD]`` row may combine only one replica's view. So
the walk's exit test must not be such a reduction: every thread walks on its own for the lanes it
holds (its own chunk index per lane, its own loads: a replica that already sees the inclusive value
stops, its twin may compose one more aggregate; both carries are exact compositions of final values,
equal up to float32 rounding), and the loop ends only when *no thread* has a lane left:
``missing_anywhere`` ORs the per-thread flags broadcast over the ``[CH, BD]`` tile, whose elements
are all distinct threads' registers. One ``[CH, BD]`` reduction per look-back step.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pack(value, tag):
    """float32 ``value`` as a record word published under ``tag`` (bits 32-62; the float bits below)."""
    bits = value.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return bits | (tag.to(tl.int64) << 32)


@triton.jit
def unpack(word, tag):
    """``(value float32, published bool)`` of a record word: published iff it carries ``tag``."""
    value = (word & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    return value, (word >> 32) == tag.to(tl.int64)


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def missing_anywhere(bits, CH: tl.constexpr, BD: tl.constexpr):
    """OR of the int32 ``[BD]`` flag bits over all lanes *and all threads' copies* of them: the row
    broadcast over the ``[CH, BD]`` tile (every thread's copies are distinct elements there), reduced
    over both axes. The result (a scalar) is the same in every thread."""
    per_lane = tl.reduce(tl.broadcast_to(bits[None, :], (CH, BD)), 0, _bit_or)
    return tl.reduce(per_lane, 0, _bit_or)


#: int64 words before the records in the workspace (the ticket counter is word 0)
RECORDS_OFFSET = tl.constexpr(16)


@triton.jit
def records(ws_ptr):
    """The first record word of the workspace ``ws_ptr``."""
    return ws_ptr + RECORDS_OFFSET


@triton.jit
def take_ticket(counter_ptr, n_lane_tiles):
    """``(chunk index in scan order, lane tile, tag)`` for this program, chunk-major; one ticket per
    program of the launch.

    ``counter_ptr``: the int64 counter word, word 0 of the workspace (``epoch << 32 | tickets
    taken``, see the module doc). A scalar atomic runs in one thread and is broadcast, so the whole
    program shares the ticket."""
    old = tl.atomic_add(counter_ptr, 1)
    ticket = (old & 0xFFFFFFFF).to(tl.int32)
    epoch = old >> 32
    if ticket == tl.num_programs(0) - 1:  # every ticket of this launch is taken: reset for the next launch
        tl.atomic_xchg(counter_ptr, (epoch + 1) << 32)
    return ticket // n_lane_tiles, ticket % n_lane_tiles, epoch + 1


@triton.jit
def lookback_diag(rec, k, agg_a, agg_y, tag, CH: tl.constexpr, BD: tl.constexpr, WIN: tl.constexpr):
    """Carry-in ``[BD]`` of chunk ``k`` (scan order) of the diagonal scan; publishes its records.

    ``rec``: pointer row ``[BD]`` to chunk 0's record of this lane tile (records ``3 * BD`` words
    apart: ``A``, aggregate ``Y``, inclusive ``Y``); ``agg_a, agg_y [BD]``: this chunk's aggregate;
    ``tag``: this launch's tag (``take_ticket``); ``CH``: rows of the program's ``[CH, BD]`` tile.

    First the predecessor's inclusive value alone (usually there when many lane tiles run per chunk);
    then windows of ``WIN`` records per step, loaded together and composed from the top down to the
    first inclusive value, or up to a record not yet published, where the next window starts: ``WIN``
    chunks per memory round trip, for the long walks of few lane tiles (one long sequence).
    """
    carry = tl.zeros([BD], dtype=tl.float32)
    if k > 0:
        here = rec + k * 3 * BD
        tl.store(here, pack(agg_a, tag))
        tl.store(here + BD, pack(agg_y, tag))
        j = tl.full([BD], k - 1, tl.int32)  # per lane (and thread): the next chunk to read
        vi, inc = unpack(tl.load(rec + j * 3 * BD + 2 * BD, volatile=True), tag)
        carry = tl.where(inc, vi, carry)
        live = ~inc
        prod = tl.full([BD], 1.0, tl.float32)
        while missing_anywhere(live.to(tl.int32), CH, BD) != 0:
            go = live  # still composing this lane in this window
            jn = j
            done = tl.zeros([BD], dtype=tl.int1)
            for r in tl.static_range(WIN):  # the loads depend on j and live only: issued together
                cj = j - r
                there = rec + cj * 3 * BD
                ok = live & (cj >= 0)
                vi, inc = unpack(tl.load(there + 2 * BD, mask=ok, other=0, volatile=True), tag)
                va, fa = unpack(tl.load(there, mask=ok, other=0, volatile=True), tag)
                vy, fy = unpack(tl.load(there + BD, mask=ok, other=0, volatile=True), tag)
                take_inc = go & inc
                take_agg = go & ~inc & fa & fy
                carry = tl.where(take_inc, carry + prod * vi, tl.where(take_agg, carry + prod * vy, carry))
                prod = tl.where(take_agg, prod * va, prod)
                jn = tl.where(take_agg, cj - 1, jn)
                go = take_agg
                done = done | take_inc
            live = live & ~done
            j = jn
    tl.store(rec + k * 3 * BD + 2 * BD, pack(agg_y + agg_a * carry, tag))
    return carry


@triton.jit
def lookback_block2(rec, k, g00, g01, g10, g11, gy0, gy1, tag, CH: tl.constexpr, BD: tl.constexpr):
    """Carry-in ``(r0, r1)`` of chunk ``k`` of the 2x2-block scan; publishes its records.

    Records ``8 * BD`` words apart: ``A00, A01, A10, A11``, aggregate ``Y0, Y1``, inclusive ``Y0, Y1``.
    A probe of the predecessor's inclusive value, then one record per step.
    """
    r0 = tl.zeros([BD], dtype=tl.float32)
    r1 = tl.zeros([BD], dtype=tl.float32)
    if k > 0:
        here = rec + k * 8 * BD
        tl.store(here, pack(g00, tag))
        tl.store(here + BD, pack(g01, tag))
        tl.store(here + 2 * BD, pack(g10, tag))
        tl.store(here + 3 * BD, pack(g11, tag))
        tl.store(here + 4 * BD, pack(gy0, tag))
        tl.store(here + 5 * BD, pack(gy1, tag))
        j = tl.full([BD], k - 1, tl.int32)
        i0, e0 = unpack(tl.load(rec + j * 8 * BD + 6 * BD, volatile=True), tag)
        i1, e1 = unpack(tl.load(rec + j * 8 * BD + 7 * BD, volatile=True), tag)
        live = ~(e0 & e1)
        r0 = tl.where(live, r0, i0)
        r1 = tl.where(live, r1, i1)
        # running product P (2x2) of the coefficients between chunk j and us; carry += P @ value
        p00 = tl.full([BD], 1.0, tl.float32)
        p01 = tl.zeros([BD], dtype=tl.float32)
        p10 = tl.zeros([BD], dtype=tl.float32)
        p11 = tl.full([BD], 1.0, tl.float32)
        while missing_anywhere(live.to(tl.int32), CH, BD) != 0:
            there = rec + j * 8 * BD
            i0, e0 = unpack(tl.load(there + 6 * BD, mask=live, other=0, volatile=True), tag)
            i1, e1 = unpack(tl.load(there + 7 * BD, mask=live, other=0, volatile=True), tag)
            q00, f00 = unpack(tl.load(there, mask=live, other=0, volatile=True), tag)
            q01, f01 = unpack(tl.load(there + BD, mask=live, other=0, volatile=True), tag)
            q10, f10 = unpack(tl.load(there + 2 * BD, mask=live, other=0, volatile=True), tag)
            q11, f11 = unpack(tl.load(there + 3 * BD, mask=live, other=0, volatile=True), tag)
            v0, h0 = unpack(tl.load(there + 4 * BD, mask=live, other=0, volatile=True), tag)
            v1, h1 = unpack(tl.load(there + 5 * BD, mask=live, other=0, volatile=True), tag)
            inc = live & e0 & e1
            walk = live & ~inc & f00 & f01 & f10 & f11 & h0 & h1
            use = inc | walk
            w0 = tl.where(inc, i0, v0)
            w1 = tl.where(inc, i1, v1)
            r0 = tl.where(use, r0 + p00 * w0 + p01 * w1, r0)
            r1 = tl.where(use, r1 + p10 * w0 + p11 * w1, r1)
            n00 = p00 * q00 + p01 * q10
            n01 = p00 * q01 + p01 * q11
            n10 = p10 * q00 + p11 * q10
            n11 = p10 * q01 + p11 * q11
            p00 = tl.where(walk, n00, p00)
            p01 = tl.where(walk, n01, p01)
            p10 = tl.where(walk, n10, p10)
            p11 = tl.where(walk, n11, p11)
            j = tl.where(walk, j - 1, j)
            live = live & ~inc
    here = rec + k * 8 * BD
    tl.store(here + 6 * BD, pack(gy0 + g00 * r0 + g01 * r1, tag))
    tl.store(here + 7 * BD, pack(gy1 + g10 * r0 + g11 * r1, tag))
    return r0, r1
