"""Experiments: the model, Lightning training, sweeps, presets."""
