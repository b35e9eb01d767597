"""How a trial's optimizer steps run, beside the eager LightningModule: replays of a captured CUDA graph
(``cuda_graph``: the precision plugin and the compiled loss; the LightningModule of captured steps is
``experiments.trial.captured``), sweep workers under the CUDA Multi-Process Service (``mps``), SIGTERM
unwinding as Ctrl-C does (``signals``) and how Triton autotuning runs in a sweep (``autotune``). Imports
nothing else of ``experiments``."""
