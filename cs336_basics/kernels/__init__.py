"""The package's hand-written GPU kernels, in one private place: each Triton kernel (`*_triton.py`) beside the plain
torch definition it must match (`*_reference.py`, also the CPU path). Nothing here is a public name: the fused FP8
path (precision/fused/) and the optimizer (optim/) launch them, and their tests hold each kernel to its reference.

fp8_format.py: the FP8 formats and saturating cast that kernels, references and scaling share; tiles.py: the tile
shapes and per-tile recording the cast kernels share; multi_tensor.py + multi_tensor_triton.py: launches that read
many tensors through tables of addresses (the optimizer step, the delayed-scaling update).
"""

import importlib
from types import ModuleType

import torch


def kernels_for(device: torch.device, reference: ModuleType) -> ModuleType:
    """The implementation of `reference`'s ops for `device`: its Triton twin (`<name>_triton`, importing triton) on
    CUDA, the reference itself (the torch definition) elsewhere."""
    if device.type != "cuda":
        return reference
    return importlib.import_module(reference.__name__.removesuffix("_reference") + "_triton")
