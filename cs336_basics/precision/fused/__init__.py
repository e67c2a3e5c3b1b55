"""This package's own FP8 training path (`--fp8_path fused`): FP8 linears whose casts are cheap enough to pay at
course scale. scaling.py: casts, dynamic and delayed scales; linear.py: the FP8 GEMM sites; swiglu.py: the SwiGLU
block in FP8, its activations written in FP8 by the kernels of kernels/swiglu_triton.py (kernels/swiglu_reference.py:
their definition and the CPU path); units.py: how FP8 linears are grouped and typed; convert.py: the swap (the path's
converter). A LoRA fine-tune's frozen base (lora/) is built from these modules too, never from convert.py."""
