"""CUDA graphs under FSDP2: what the compiled blocks need so that their graphs replay instead of being recorded again.

Inductor's CUDA graphs (cudagraph trees) take a compiled region's parameters and buffers as static inputs: read in
place, at the address they had when the graph was recorded, and recorded again when that address moves. Two things
about FSDP2 break that; wrap.parallelize applies both fixes where the plan runs FSDP2 under CUDA graphs
(ParallelPlan.keep_gathered_weights):

- FSDP2 frees a unit's gathered weights after use (their storage resized to nothing) and allocates them again at the
  next all-gather, wherever the allocator finds room, so their addresses move between steps: the blocks' graphs were
  recorded again nearly every step, at a quarter of the speed without graphs
  (INDEX.md: 2026-11-28-fsdp2-cpp-wrapper-x2-h200; pytorch/pytorch#183451 traces it to the allocator's block order).
  `keep_gathered_weights` leaves each gathered weight's storage allocated: every all-gather still refreshes it, in
  place, so the weights are as fresh as before and their addresses stay. The cost is memory: one gathered copy of
  the weights per GPU, as DDP holds (the summary says so).
  Through FSDP2's all-gather extension (TorchAO's FP8 all-gather, --fp8_all_gather) the FP8 data is refreshed in
  place too, but each gather sets a new scale tensor on the gathered weight, whose address moved: the blocks' graphs
  were recorded again in steps 2-5 of 6 (INDEX.md: 2026-11-29-matrix-and-fsdp2-fp8-gather-h200), and whether the
  addresses settle after that is the allocator's luck. So the first scale stays, and each gather's is copied into it.
- Dynamo takes an FSDP2-managed module's buffers as ordinary graph inputs, not static ones, and inductor captures no
  graph that writes into a non-static input: delayed scaling's amax recordings are such buffers, so no fused FP8
  block was captured ("skipping cudagraphs due to mutated inputs"). `mark_buffers_static` marks them static, as
  dynamo does by itself outside FSDP2 (INDEX.md: 2026-11-29-fsdp2-cuda-graphs-h200).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from cs336_basics.errors import NotSupportedHere


def keep_gathered_weights(model: nn.Module) -> None:
    """Make FSDP2 keep the gathered weights of every unit in `model` (sharded with fully_shard) allocated between
    uses, with the same inner tensors where they are a tensor subclass. Gathering is unchanged: each all-gather copies
    into the same storage. There is no public switch for this in torch's FSDP2, so it reaches into its per-parameter
    state; a torch whose FSDP2 lacks it is refused."""
    from torch.distributed.fsdp import FSDPModule

    try:
        groups = {id(group): group for module in model.modules() if isinstance(module, FSDPModule)
                  if (group := module._get_fsdp_state()._fsdp_param_group) is not None}  # fmt: skip
        for group in groups.values():
            for fsdp_param in group.fsdp_params:
                for method in ("free_unsharded_param", "init_unsharded_param"):
                    if not callable(getattr(fsdp_param, method, None)):
                        raise AttributeError(f"FSDPParam has no {method}")
                fsdp_param.free_unsharded_param = _keep_allocated
                # Only a parameter gathered through the all-gather extension gets new inner tensors: the others'
                # gathers pay nothing for it.
                if hasattr(fsdp_param._sharded_local_tensor, "fsdp_post_all_gather"):
                    fsdp_param.init_unsharded_param = _inner_tensors_kept(fsdp_param, fsdp_param.init_unsharded_param)
    except AttributeError as e:
        raise NotSupportedHere(
            f"CUDA graphs under FSDP2 need its gathered weights kept at fixed addresses, which this package does "
            f"through FSDP2's per-parameter state, and torch {torch.__version__}'s FSDP2 differs ({e}). Use "
            "--compile_mode default (or auto) under FSDP2."
        ) from e


def _keep_allocated() -> None:
    """FSDPParam.free_unsharded_param's replacement: the gathered storage stays for the next all-gather."""


def _inner_tensors_kept(fsdp_param, init_unsharded_param):
    """FSDPParam.init_unsharded_param (which builds the gathered weight after each all-gather) made to keep the
    inner tensors of a gathered weight that FSDP2's all-gather extension builds (TorchAO's FP8 weight: data and
    scale): one that the extension replaced is copied into the one it replaced, which stays."""

    def init_in_place() -> None:
        gathered = getattr(fsdp_param, "_unsharded_param", None)  # none before the first all-gather
        kept = {}
        if is_traceable_wrapper_subclass(gathered):
            kept = {name: getattr(gathered, name) for name in gathered.__tensor_flatten__()[0]}
        init_unsharded_param()
        for name, tensor in kept.items():
            if (new := getattr(gathered, name)) is not tensor:
                tensor.copy_(new)
                setattr(gathered, name, tensor)

    return init_in_place


def mark_buffers_static(model: nn.Module) -> None:
    """Mark every buffer of `model` as a static input of compiled graphs (read and written in place at a fixed
    address). Call once the buffers are final: after the precision's are sized (Converter.prepare re-registers
    delayed scaling's recordings) and before the first compiled step; a buffer replaced later is not marked."""
    for buffer in model.buffers():
        torch._dynamo.mark_static_address(buffer)
