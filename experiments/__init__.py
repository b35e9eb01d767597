"""Experiments: the model, Lightning training, sweeps, presets (SPEC §4, §8)."""
