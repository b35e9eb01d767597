"""Kernel benchmarks and tools: ``python -m benchmarks.ops <family|tool> [options]``.

Families (``seqkernels/<family>``): ``scan``, ``newton``, ``fused_rnn``, ``mlstm``, ``ssd``: every backend
of the family and every peer library installed, each checked against the float64 reference before it
is timed, in one run; rows go to ``benchmarks/ops/results/<family>.json``. Tools: ``compile`` (the
compile report: registers, spills, shared memory of the Triton kernels, without a GPU), ``warm``
(compile every family's timed kernels in parallel processes). Shared machinery: ``common.py``.
"""
