"""CS336-style transformer language model with an honest BF16/FP8 training path."""
