"""Sequence primitives as plain functions: a readable reference and fast (Triton) versions.

One folder per family (``scan``, ``newton``, ``fused_rnn``, ``mlstm``, ``ssd``), each with
``reference.py`` and fast paths of the same signature. This package imports nothing else of the
suite. Families, backend vocabulary, benchmarks: ``seqkernels/README.md``.
"""
