"""Hugging Face causal LMs through this package's training and FP8 checks (the `hf` extra: `uv sync --extra hf`).

models.py builds a transformers causal LM from a config (a named shape, a local directory or a hub id; random
weights, nothing downloaded but a hub id's config) behind the forward our training code calls, and gives the run's
model section the config's shape. The build stage imports it only for --hf_model; the FP8 doctor's findings, which
work on any model, are diagnostics/doctor.py's, and Accelerate's FP8 path is precision/accelerate.py.
"""
