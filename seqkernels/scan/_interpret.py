"""Faster ``tl.associative_scan`` for the Triton CPU interpreter (``TRITON_INTERPRET=1``), for tests.

The interpreter's generic scan calls the combine function once per *element*, in Python; this
replacement calls it once per position along the scan axis on whole slices (the same left fold,
in the same order, vectorized over the other axes), which makes interpreter tests of scan kernels
tens of times faster. ``use_vectorized_interpreter_scan()`` is idempotent and does nothing when the
interpreter is not importable.
"""

from __future__ import annotations

import numpy as np


def _vectorized_generic_scan(self, input):
    datas = [arg.handle.data for arg in input]
    axis = self.axis
    n = datas[0].shape[axis]
    outs = [np.empty_like(d) for d in datas]
    acc = None
    for i in range(n):
        cur = tuple(
            self.to_tensor(np.ascontiguousarray(np.take(d, i, axis=axis)), arg.dtype) for d, arg in zip(datas, input)
        )
        if acc is None:
            acc = cur
        else:
            ret = self.combine_fn.fn(*acc, *cur)
            acc = ret if isinstance(ret, tuple) else (ret,)
        for o, a in zip(outs, acc):
            idx = [slice(None)] * o.ndim
            idx[axis] = i
            o[tuple(idx)] = a.handle.data
    return [self.to_tensor(o, arg.dtype) for o, arg in zip(outs, input)]


def use_vectorized_interpreter_scan() -> bool:
    """Patch the interpreter's scan; returns whether the patch is in place."""
    try:
        from triton.runtime import interpreter
    except Exception:
        return False
    ops = getattr(interpreter, "ScanOps", None)
    if ops is None or not hasattr(ops, "generic_scan"):
        return False
    ops.generic_scan = _vectorized_generic_scan
    return True
