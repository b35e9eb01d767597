"""Triton autotuning in a sweep: cached on disk across processes, skipped by the up-front model check.

An autotuned Triton kernel (fla's chunked delta-rule kernels among them) compiles and times every
configuration the first time it meets a new key of shapes and dtypes, per process. Two things keep
that from costing minutes per sweep:

- ``cache_autotuning_on_disk()`` sets ``TRITON_CACHE_AUTOTUNING=1`` (unless the environment sets it)
  before any kernel is defined, so every autotuner keeps its timings in Triton's cache folder: the
  workers of a run and later runs on the machine read the chosen configuration instead of timing
  again (fla asks for the same with its own ``FLA_CACHE_RESULTS``).
- ``first_config_only()``: inside it an autotuner that meets a new key runs its first configuration
  without timing the others, and forgets that choice when the block ends, so training in the same
  process still tunes. The model check (``experiments.sweeps.runner.validate_specs``) runs in it: it
  checks that a model builds and runs, not which configuration is fastest.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: Triton's switch for keeping autotuning results on disk (``triton.knobs.autotuning.cache``)
CACHE_ENV = "TRITON_CACHE_AUTOTUNING"


def cache_autotuning_on_disk() -> None:
    """Ask Triton to keep autotuning timings on disk (inherited by worker processes started later)."""
    os.environ.setdefault(CACHE_ENV, "1")


@contextlib.contextmanager
def first_config_only() -> Iterator[None]:
    """Autotuned Triton kernels first called inside the block run their first (pruned) configuration,
    untimed; the keys chosen so are forgotten on exit. A no-op without Triton."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        yield
        return
    original = Autotuner.prune_configs
    known: dict[int, tuple[Autotuner, set]] = {}  # per autotuner met: the keys it had before the block

    def first_only(self, kwargs):
        known.setdefault(id(self), (self, set(self.cache)))
        return original(self, kwargs)[:1]

    Autotuner.prune_configs = first_only
    try:
        yield
    finally:
        Autotuner.prune_configs = original
        for tuner, before in known.values():
            for key in set(tuner.cache) - before:
                del tuner.cache[key]
