"""How a trial's optimizer steps run, beside the eager LightningModule: replays of a captured CUDA graph
(``cuda_graph``: the precision plugin and the compiled loss) and sweep workers under the CUDA
Multi-Process Service (``mps``). Imports nothing else of ``experiments``."""
