"""Experiments: the CLIs (``sweep``, ``reproduce``, ``probe``, ``paper``, sharing ``cli``) over one trial
(``trial``), the step engines (``engines``) and the sweep machinery (``sweeps``); the presets' YAML in
``presets/``."""
