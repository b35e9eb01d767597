"""Solve the block bi-diagonal system of one Newton step (paper 000 eq. 3-5) by a linear scan.

``delta_t = J_t delta_{t-1} + r_t`` (forward) or ``lambda_t = J_t lambda_{t+1} + g_t`` (reverse),
with the Jacobians stored in one of three structures (state size ``S``):

=========  ==============================  ==============================================
structure  ``jac`` shape                   meaning
=========  ==============================  ==============================================
diag       ``(*batch, L, S)``              ``J = diag(jac)``
block2     ``(*batch, L, 2, 2, S // 2)``   ``J = [[diag(jac[0,0]), diag(jac[0,1])], [...]]``
                                           on the state split in halves ``[s_0, s_1]``
dense      ``(*batch, L, S, S)``           ``J[i, j] = d f_i / d h_j``
=========  ==============================  ==============================================

``rhs`` and the result are ``(*batch, L, S)``.
"""

from __future__ import annotations

import math

import torch

from seqkernels.scan import linear_scan, linear_scan_block2, linear_scan_dense

STRUCTURES = ("diag", "block2", "dense")


def check_structure(structure: str) -> None:
    if structure not in STRUCTURES:
        raise ValueError(f"unknown Jacobian structure {structure!r}; valid: {', '.join(STRUCTURES)}")


def jacobian_shape(structure: str, lead: tuple[int, ...], state_size: int) -> tuple[int, ...]:
    """The shape of a structured Jacobian for states ``(*lead, S)``."""
    check_structure(structure)
    if structure == "diag":
        return (*lead, state_size)
    if structure == "block2":
        return (*lead, 2, 2, state_size // 2)
    return (*lead, state_size, state_size)


def transpose_jacobian(jac: torch.Tensor, structure: str) -> torch.Tensor:
    """``J^T`` in the same structure."""
    check_structure(structure)
    if structure == "diag":
        return jac
    if structure == "block2":
        return jac.transpose(-3, -2)
    return jac.transpose(-2, -1)


def solve_bidiagonal(
    jac: torch.Tensor, rhs: torch.Tensor, structure: str, reverse: bool = False, backend: str = "auto"
) -> torch.Tensor:
    """The solution ``y`` of ``y_t = J_t y_{t-1} + rhs_t`` (``reverse``: ``J_t y_{t+1}``), ``y`` out of range = 0.

    ``backend`` names a ``seqkernels.scan`` backend (dense Jacobians use the dense scan, whose
    backends are ``reference`` and ``torch``; ``auto`` maps to ``torch`` there).
    """
    check_structure(structure)
    if rhs.dim() < 2:
        raise ValueError(f"rhs must be (*batch, L, S), got shape {tuple(rhs.shape)}")
    *lead, L, S = rhs.shape
    N = math.prod(lead)
    want = jacobian_shape(structure, (*lead, L), S)
    if tuple(jac.shape) != want:
        raise ValueError(
            f"{structure} Jacobian has shape {tuple(jac.shape)}, expected {want} for rhs {tuple(rhs.shape)}"
        )
    if structure == "diag":
        y = linear_scan(jac.reshape(N, L, S), rhs.reshape(N, L, S), reverse=reverse, backend=backend)
    elif structure == "block2":
        if S % 2:
            raise ValueError(f"block2 Jacobians need an even state size, got {S}")
        y = linear_scan_block2(
            jac.reshape(N, L, 2, 2, S // 2), rhs.reshape(N, L, 2, S // 2), reverse=reverse, backend=backend
        )
    else:
        if backend not in ("auto", "reference", "torch"):
            raise ValueError(f"dense Jacobians have no {backend!r} scan; valid backends: auto, reference, torch")
        y = linear_scan_dense(jac.reshape(N, L, S, S), rhs.reshape(N, L, S), reverse=reverse, backend=backend)
    return y.reshape(rhs.shape)
