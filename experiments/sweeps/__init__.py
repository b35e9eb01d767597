"""Sweeps: presets into cells (``presets``), the cells as one Optuna study (``study``), the workers that
claim and train them (``workers``, ``_heartbeat``), the one runner under every training CLI
(``runner``) and the results files and tables (``results``). Imports the trial and the engines, never
the CLIs."""
