"""Recurrent cells written as one recurrence step, and their Newton-parallel mixers.

``RNNCell`` (``base.py``): the cell interface and derived Jacobians / checks. ``cell_mixer``
(``mixer.py``): a cell class -> a multi-head mixer with modes sequential / parallel /
parallel-triton / fused. ``FlashGRUCell``, ``FlashLSTMCell`` (``flash.py``): paper 000's cells,
registered as the mixers ``flashgru`` and ``flashlstm``. ``newton_residuals``
(``convergence.py``): the per-iteration residuals of paper 000 Fig. 4.
"""

from mixers.cells.base import JacobianCheck, RNNCell
from mixers.cells.flash import FlashGRUCell, FlashLSTMCell
from mixers.cells.mixer import MODES, CellMixer, cell_mixer
from seqkernels.newton import NewtonDivergenceError, NewtonStats

__all__ = [
    "MODES",
    "CellMixer",
    "FlashGRUCell",
    "FlashLSTMCell",
    "JacobianCheck",
    "NewtonDivergenceError",
    "NewtonStats",
    "RNNCell",
    "cell_mixer",
]
