"""Training: the loop, metrics and atomic, exactly-resumable checkpoints."""
