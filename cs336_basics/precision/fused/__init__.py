"""This package's own FP8 training path (`--fp8_path fused`): FP8 linears whose casts are cheap enough to pay at
course scale. scaling.py: casts, dynamic and delayed scales; linear.py: the FP8 GEMM sites; convert.py: the swap."""
