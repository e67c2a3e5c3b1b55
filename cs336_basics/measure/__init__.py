"""What a measurement is made of: CUDA-event timing of whole steps and of single calls (timing.py), and the one
results-file schema every script writes (results.py)."""
