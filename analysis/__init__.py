"""Analysis: tables and figures from what ``experiments`` writes (kernel timings: ``benchmarks.ops.plot``).

Each module is a CLI writing PNG + PDF figures and the CSV of every plotted number beside them:

- ``python -m analysis.tables RESULTS...``: accuracy tables (Markdown, LaTeX, CSV) from
  ``results.csv`` files, with the papers' numbers side by side (``experiments.paper``).
- ``python -m analysis.newton``: Newton residual vs iteration for sequence lengths 2^6 … 2^14,
  for freshly initialized cells and for cells from trained checkpoints (paper 000 Fig. 4).
- ``python -m analysis.transfer``: mLSTM transfer-gain heatmaps (paper 002 Fig. 3, 6, 7).
- ``python -m analysis.depth RESULTS...``: the minimum number of layers reaching a threshold vs
  sequence length, per mixer and task (Merrill et al. 2024, Fig. 3).

Dependencies: ``mixers``, ``seqkernels``, ``tasks`` and files on disk; ``experiments`` only to reuse
the results aggregation (``experiments.sweeps.results``) and to rebuild trained models from checkpoints.
"""
