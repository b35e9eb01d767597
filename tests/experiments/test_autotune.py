"""``experiments.engines.autotune``: the model check runs one configuration per autotuned kernel and leaves
no untuned choice behind; autotuning results are cached on disk for the workers and later runs."""

import os
import time

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from experiments.engines.autotune import CACHE_ENV, cache_autotuning_on_disk, first_config_only  # noqa: E402

CONFIGS = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]


def _cpu_bench(kernel_call, quantiles):
    """Triton's default timer needs a GPU; under the CPU interpreter time with the host clock."""
    start = time.perf_counter()
    kernel_call()
    return [time.perf_counter() - start] * len(quantiles)


@triton.autotune(configs=CONFIGS, key=["n"], do_bench=_cpu_bench)
@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def _run(n: int) -> torch.Tensor:
    x = torch.arange(n, dtype=torch.float32)
    _add_one[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n)
    return x


@pytest.mark.triton
def test_the_check_runs_the_first_config_only_and_forgets_it(monkeypatch):
    tried = []
    original = _add_one._bench
    monkeypatch.setattr(
        _add_one, "_bench", lambda *a, config, **k: tried.append(config) or original(*a, config=config, **k)
    )
    _add_one.cache.clear()
    with first_config_only():
        torch.testing.assert_close(_run(37), torch.arange(37, dtype=torch.float32) + 1)  # ran once: untimed
        assert tried == [] and _add_one.best_config.kwargs == {"BLOCK": 16}  # no timing, the first config
    assert _add_one.cache == {}  # nothing untuned is left for training in this process
    _run(37)  # (timing each configuration runs this in-place kernel once more per configuration)
    assert sorted(c.kwargs["BLOCK"] for c in tried) == [16, 32, 64]  # outside: tuned as usual


def test_autotuning_is_cached_on_disk_unless_the_environment_says_otherwise(monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    cache_autotuning_on_disk()
    assert os.environ[CACHE_ENV] == "1"
    monkeypatch.setenv(CACHE_ENV, "0")
    cache_autotuning_on_disk()
    assert os.environ[CACHE_ENV] == "0"
