"""Hugging Face causal LMs through this package's FP8 checks (the `hf` extra: `uv sync --extra hf`).

models.py builds a transformers causal LM from a config (a named shape, a local directory or a hub id; random
weights, nothing downloaded but a hub id's config) behind the forward our training code calls; diagnosis.py says
what FP8 would do to it before anything is timed: which linears each conversion policy converts and why not the
rest, and how much of the step's work those GEMMs can be. Nothing else in the package imports this folder.
"""
