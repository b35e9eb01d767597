"""The defaults of a trial's model shape and precision, in one place for ``TrialSpec``, ``ModelConfig``,
the preset's ``SweepPlan`` and the results columns of trials stored before a field existed; and the check
of the one shape field whose valid range includes 0 (``conv_kernel``).

Import-light on purpose (no torch): the results and preset modules read it.
"""

#: sequence blocks of the model
LAYERS = 1
#: the model's width (embedding and mixer channels)
D_MODEL = 64
#: the full block's causal convolution kernel (0: none)
CONV_KERNEL = 4
#: Lightning precision settings a trial can train with (the first is the default)
PRECISIONS = ("32-true", "bf16-mixed")


def check_conv_kernel(conv_kernel: object) -> None:
    """Raise ``ValueError`` unless ``conv_kernel`` is an integer >= 0 (0: no convolution)."""
    if isinstance(conv_kernel, bool) or not isinstance(conv_kernel, int) or conv_kernel < 0:
        raise ValueError(f"conv_kernel must be an integer >= 0 (0: no convolution), got {conv_kernel!r}")
