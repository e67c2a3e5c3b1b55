"""Files a run writes and reads back: atomic writes (atomic.py), checkpoint checksums checked on every read
(integrity.py), and output paths checked before the work (output_paths.py)."""
