"""Put this folder on ``PYTHONPATH`` and every Triton autotuner in every Python process runs its first
configuration only: no autotuning. For correctness runs (tests, smoke sweeps) of autotuned peer kernels
(fla tunes each kernel over up to dozens of configurations in every fresh process: minutes per kernel
family); never for timings. ``benchmarks/mixers_gpu.sh`` uses it with ``FIRST_CONFIG=1``."""

try:
    from triton.runtime import autotuner
except ImportError:  # no Triton in this interpreter: nothing to patch
    pass
else:
    _prune = autotuner.Autotuner.prune_configs

    def _first_config(self, *args, **kwargs):
        return _prune(self, *args, **kwargs)[:1]

    autotuner.Autotuner.prune_configs = _first_config
    autotuner.Autotuner.first_config_only = True  # read by reports that state how they were run
