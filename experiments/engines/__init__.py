"""How a trial's optimizer steps run, beside the eager LightningModule: replays of a captured CUDA graph
(``cuda_graph``: the precision plugin and the compiled loss; ``captured``: the graph engines' hook into
the module) and sweep workers under the CUDA Multi-Process Service (``mps``). Imports nothing else of
``experiments``."""
