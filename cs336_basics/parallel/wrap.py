"""--parallel: which data-parallel mode a run uses, and the model wrapped and compiled for it.

The model itself holds no parallelism code. The Trainer applies, in order: the built model (already on its device,
BF16 and FP8-converted) -> `compile_for_training` -> `parallelize` (DDP wrapper, or FSDP2's `fully_shard` per unit
of consecutive blocks and the root) -> the optimizer over the (possibly sharded) parameters. Compiling first is
torchtitan's order, and under DDP the one that keeps fullgraph. This package's model is compiled by region, in
place (each block's forward, the embedding and the output: `compile_for_training`):

- DDP replicates the model; gradients are all-reduced in buckets while backward still runs (DDP's reducer hooks),
  with no search for unused parameters (every parameter gets a gradient every step). DDP wraps the model whose
  regions are compiled (a Hugging Face model: the torch.compile wrapper). Compiling the DDP wrapper instead breaks
  the graph at DDP's own forward (torch 2.15, fullgraph: "Dynamo does not know how to trace method
  `_rebuild_buckets` of class `Reducer`"). Each block's backward is a graph of its own, so its parameters'
  gradients are ready, and their buckets all-reduced, while the blocks below it still run backward.
  With gradient accumulation, micro-batches but the last skip the all-reduce (`no_sync`). Under CUDA graphs every
  micro-batch skips it, and each rank's sums, kept outside the graphs' memory, are averaged once after the last
  (`graph_accumulation_reduce`; training/accumulation.py says why).
- FSDP2 shards each block's parameters (and so its gradients, fp32 masters and AdamW moments, which the optimizer
  keeps per local shard) over the ranks, all-gathering a unit's weights just before its first block runs. A unit is
  --fsdp_blocks_per_unit consecutive blocks (2 by default): each unit costs FSDP2's hooks and collectives on the
  host every step, and at small batches the step waits for the slowest rank's host. The parameters stay
  in the weight dtype (BF16 on GPU): all-gathers move BF16 and gradients are reduce-scattered in BF16, as DDP
  all-reduces them and as one GPU accumulates them; the fp32 masters take the averaged gradient. Each block's
  forward is compiled on its own (fullgraph): FSDP2's all-gather and reshard hooks, registered on the block module,
  run around it, outside the graph. The root's own forward runs eager (it calls the blocks, whose hooks a fullgraph
  compile could not trace), but the embedding and the output (final norm, lm_head, loss) it calls are compiled
  regions of their own, as without FSDP2: the root's all-gather has run by then, so they see gathered weights, and
  the loss never materialises fp32 logits.
  With FP8 the weights are all-gathered in BF16 and cast inside the compiled blocks, by either FP8 path (the fused
  path's linears read their weights when they run, so they see FSDP2's gathered ones), unless
  --fp8_all_gather: then torchao casts each shard to FP8 before its all-gather, in its own eager kernels, outside
  the compiled graph, once per all-gather (twice per step when blocks re-gather for backward). Half the bytes, but on
  one GPU of FSDP2 (no communication) those casts cost more than FP8 saves (INDEX.md:
  2026-11-23-fsdp-overheads-h200), so it is off by default, as in torchtitan.
  Under CUDA graphs (--compile_mode reduce-overhead; auto's choice for FP8 without accumulation) the blocks' graphs
  need fixed addresses: the gathered weights stay allocated between steps and the buffers are static inputs
  (fsdp_graphs.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from cs336_basics.compiled import compile_options, runs_cuda_graphs, write_shared_fp8_gemm_inputs_once
from cs336_basics.config import PRESETS, RunConfig, TrainConfig
from cs336_basics.errors import ConfigError
from cs336_basics.parallel.fsdp_graphs import keep_gathered_weights, mark_buffers_static
from cs336_basics.parallel.world import World, all_reduce_

NONE, DDP, FSDP = "none", "ddp", "fsdp"

# auto picks FSDP when the replicated model state (weights, gradients, fp32 masters, AdamW moments) would take more
# than this share of one device's memory: the rest is what activations, the compiled graph's buffers and the
# allocator's slack need at our batch shapes (at 4 x 2048 on one GPU, the 1.3b preset's model state, 16 bytes per
# parameter, was most of its peak: INDEX.md, 2026-11-25-defaults-cold-h200).
AUTO_FSDP_STATE_SHARE = 0.5


@dataclass(frozen=True)
class ParallelPlan:
    mode: str  # none, ddp or fsdp
    world: World
    reason: str  # why this mode (the summary prints it)
    state_gib_per_rank: float  # model state each rank holds: weights, gradients, fp32 masters, AdamW moments
    device_gib: float | None  # one rank's device memory (None on CPU)
    fp8_all_gather: bool = False  # FSDP2 all-gathers FP8 weights (torchao's tensorwise recipe)
    ddp_bucket_mb: int = 25  # gradient megabytes per DDP all-reduce bucket
    reshard_after_forward: bool = True  # FSDP2 frees a block's gathered weights after its forward
    reshard_auto: bool = False  # auto chose reshard_after_forward (the summary says why)
    blocks_per_unit: int = 2  # FSDP2: consecutive blocks sharded (gathered, reduced) as one unit
    # FSDP2 under CUDA graphs: gathered weights stay allocated, buffers are static inputs (parallel/fsdp_graphs.py)
    keep_gathered_weights: bool = False
    unused_flags: tuple[str, ...] = ()  # FSDP2 or DDP settings this run asked for that its mode does not use

    def summary_line(self) -> str:
        line = f"{self.mode}, world size {self.world.world_size}: {self.reason}"
        fsdp = [flag for flag in self.unused_flags if flag not in DDP_FLAGS]
        ddp = [flag for flag in self.unused_flags if flag in DDP_FLAGS]
        if fsdp:
            needs_fp8 = "; --fp8_all_gather needs FP8 too" if "--fp8_all_gather" in fsdp else ""
            line += f"; not used here: {', '.join(fsdp)} (FSDP2 settings{needs_fp8})"
        if ddp:
            line += f"; not used here: {', '.join(ddp)} (DDP settings)"
        if self.mode == DDP:
            line += f"; {self.ddp_bucket_mb} MB all-reduce buckets"
        if self.mode == FSDP:
            line += "; weights all-gathered in FP8" if self.fp8_all_gather else "; weights all-gathered in their dtype"
            line += (
                "; blocks re-gather their weights for backward"
                if self.reshard_after_forward
                else "; blocks keep their gathered weights from forward to backward"
            )
            if self.reshard_auto:
                kept = "under CUDA graphs they stay allocated anyway" if self.keep_gathered_weights else "least memory"
                line += f" (auto: {kept})"
            if self.blocks_per_unit > 1:
                line += f"; {self.blocks_per_unit} blocks per FSDP2 unit"
            if self.keep_gathered_weights:
                line += (
                    "; gathered weights stay allocated between steps, so that CUDA graphs replay at fixed addresses "
                    "(one gathered copy of the weights per GPU)"
                )
                if self.reshard_after_forward:
                    line += "; gathering them again for backward frees nothing then (--no_fsdp_reshard_after_forward)"
        return line

    def memory_line(self) -> str:
        per_rank = f"{self.state_gib_per_rank:.2f} GiB of model state per {'GPU' if self.device_gib else 'process'}"
        if self.mode == FSDP:
            per_rank += f" (sharded {self.world.world_size} ways)"
        if self.device_gib is not None:
            per_rank += f", of {self.device_gib:.1f} GiB"
        return per_rank + "; measured peak per GPU in metrics.jsonl (peak_mem_gib, the largest over ranks)"


SINGLE_PROCESS = ParallelPlan(NONE, World(), "one process", 0.0, None)


def model_state_bytes(n_params: int, dtype: torch.dtype) -> int:
    """Bytes of model state per parameter replica: weight and gradient in the weight dtype, an fp32 master when the
    weight is low precision (MasterWeightAdamW), and two fp32 AdamW moments."""
    size = torch.empty((), dtype=dtype).element_size()
    masters = 4 if size < 4 else 0
    return n_params * (2 * size + masters + 8)


def _device_memory_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory / 2**30


def check_parallel_request(config: RunConfig, world: World) -> None:
    """Refuse, with what to do, a --parallel request this launch cannot honour (before any model is built)."""
    requested = config.train.parallel
    # A resumed run keeps the --parallel it was started with, for its launches under torchrun; in one process it runs
    # as one process, and its summary says so.
    if not world.launched and requested != "auto" and not config.train.resume:
        raise ConfigError(
            f"--parallel {requested} needs several processes started by torchrun, e.g. "
            f"torchrun --standalone --nproc_per_node 2 train_h100.py --parallel {requested} ...; this process was "
            "not (no RANK/WORLD_SIZE/LOCAL_RANK in its environment). For one process pass --parallel auto."
        )


def resolve_parallel(config: RunConfig, world: World, device: torch.device, n_params: int) -> ParallelPlan:
    """The mode --parallel asks for on this world, with the reason; a ConfigError saying what to do where it cannot
    be honoured (ddp/fsdp without torchrun). `config` has use_fp8 decided."""
    check_parallel_request(config, world)
    requested = config.train.parallel
    dtype = torch.bfloat16 if config.train.dtype == "bfloat16" else torch.float32
    state_gib = model_state_bytes(n_params, dtype) / 2**30
    device_gib = _device_memory_gib(device)
    if not world.launched:
        why = "one process" + (
            f" (the run's --parallel {requested} applies under torchrun)" if requested != "auto" else ""
        )
        return ParallelPlan(NONE, world, why, state_gib, device_gib, unused_flags=_unused(config, NONE))
    if requested == "auto":
        if world.world_size == 1:
            mode, reason = NONE, "auto: one process"
        elif device_gib is not None and state_gib > AUTO_FSDP_STATE_SHARE * device_gib:
            mode = FSDP
            reason = (
                f"auto: a replica's model state ({state_gib:.1f} GiB) is more than {AUTO_FSDP_STATE_SHARE:.0%} of a "
                f"GPU's {device_gib:.0f} GiB, so it is sharded"
            )
        else:
            mode = DDP
            reason = f"auto: {world.world_size} processes and a replica's model state ({state_gib:.2f} GiB) fits"
    else:
        mode, reason = requested, f"--parallel {requested}"
    per_rank = state_gib / world.world_size if mode == FSDP else state_gib
    t = config.train
    keep = mode == FSDP and runs_cuda_graphs(t.compile_model, t.compile_mode, device)
    # Under CUDA graphs the gathered weights stay allocated (keep_gathered_weights), so a second all-gather for
    # backward would free nothing and cost a collective per unit (INDEX.md: 2026-11-29-fsdp2-reshard-graphs-h200).
    reshard = t.fsdp_reshard_after_forward
    return ParallelPlan(
        mode, world, reason, per_rank, device_gib, fp8_all_gather=_fp8_all_gather(config, mode),
        ddp_bucket_mb=t.ddp_bucket_mb, reshard_after_forward=not keep if reshard is None else reshard,
        reshard_auto=reshard is None,
        blocks_per_unit=t.fsdp_blocks_per_unit, unused_flags=_unused(config, mode), keep_gathered_weights=keep,
    )  # fmt: skip


def _fp8_all_gather(config: RunConfig, mode: str) -> bool:
    """FP8Config allows --fp8_all_gather with TorchAO's tensorwise recipe only; it applies under FSDP2 with FP8."""
    return mode == FSDP and config.fp8.use_fp8 is not False and config.fp8.fp8_all_gather


DDP_FLAGS = ("--ddp_bucket_mb",)


def _unused(config: RunConfig, mode: str) -> tuple[str, ...]:
    """The FSDP2 and DDP flags asked for (set apart from the preset's value) that `mode` does not use. Not an error:
    a run resumed at another world size (or mode) keeps its flags, and a sweep passes them to every configuration;
    the summary names them instead."""
    unused = []
    preset_train = {**dataclasses.asdict(TrainConfig()), **PRESETS.get(config.preset, {}).get("train", {})}
    if config.train.ddp_bucket_mb != preset_train["ddp_bucket_mb"] and mode != DDP:
        unused.append("--ddp_bucket_mb")
    if config.fp8.fp8_all_gather and not _fp8_all_gather(config, mode):
        unused.append("--fp8_all_gather")
    reshard = config.train.fsdp_reshard_after_forward
    if reshard is not None and mode != FSDP:
        unused.append("--fsdp_reshard_after_forward" if reshard else "--no_fsdp_reshard_after_forward")
    if config.train.fsdp_blocks_per_unit != preset_train["fsdp_blocks_per_unit"] and mode != FSDP:
        unused.append("--fsdp_blocks_per_unit")
    return tuple(unused)


def compile_for_training(model: nn.Module, mode: str, scope: str, wrapper: str, device_type: str) -> nn.Module:
    """`model` compiled for the training step on `device_type` in `mode` with inductor's `wrapper`
    (compiled.compile_options), before it is parallelized. `scope` "model" (compiled.resolve_compile_scope refuses it
    under FSDP2): one graph, in a torch.compile wrapper. "blocks", for this package's TransformerLM: compiled by
    region, in place: each block's forward, the embedding and the output (final norm, lm_head and loss). The blocks
    are one class of one shape, so dynamo compiles the first and reuses its code for the rest: compile time no longer
    grows with depth. The whole-model graph compiled several times as long (FP8's most) and its step ran a little
    faster, in BF16 and FP8 alike, for its fusions across the blocks' boundaries
    (INDEX.md: 2026-11-26-regional-compile). Under FSDP2 the root's own forward stays eager as it must: it calls the
    blocks, whose hooks a fullgraph compile could not trace."""
    write_shared_fp8_gemm_inputs_once()
    options = compile_options(mode, wrapper, device_type)
    if scope == "model":
        return torch.compile(model, **options)
    for block in model.layers:
        # The instance attribute shadows the class's forward: nn.Module.__call__ runs any hooks (FSDP2's), then this.
        block.forward = torch.compile(block.forward, **options)
    model.token_embeddings.forward = torch.compile(model.token_embeddings.forward, **options)
    model.output = torch.compile(model.output, **options)
    return model


def parallelize(model: nn.Module, compiled: nn.Module, plan: ParallelPlan, device: torch.device) -> nn.Module:
    """What the training step calls: `compiled` (one process; it is `model` when not compiling), a DDP wrapper around
    it, or `model` sharded in place by FSDP2 (its parameters become DTensor shards; names and state-dict keys stay;
    under CUDA graphs its gathered weights stay allocated and its buffers are static inputs: fsdp_graphs.py, so call
    it with the model's buffers final). DDP and FSDP2 synchronise the replicas' (or shards') starting weights
    themselves: every rank built the same seeded model anyway."""
    if plan.mode == DDP:
        from torch.nn.parallel import DistributedDataParallel

        # The only buffers are RoPE tables, identical on every rank and never updated: no broadcast before each
        # forward. torch renamed the switch (forward_sync_buffers) after 2.11, the GPU image's version.
        no_buffer_sync = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else {"broadcast_buffers": False}
        )
        return DistributedDataParallel(
            compiled,
            device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=False,  # every parameter gets a gradient: no graph search after each forward
            gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy, no second buffer
            # Each block's backward is its own compiled graph, so a bucket's all-reduce starts as soon as the blocks
            # holding its parameters are done (a Hugging Face model compiled whole: dynamo's DDPOptimizer splits its
            # graph at these buckets).
            bucket_cap_mb=plan.ddp_bucket_mb,
            **no_buffer_sync,
        )
    if plan.mode == FSDP:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (plan.world.world_size,))
        dtype = next(model.parameters()).dtype
        # Parameters are already in the weight dtype: all-gather and reduce-scatter in it (see the module docstring).
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
        blocks, size = list(model.layers), plan.blocks_per_unit
        units = [blocks[i : i + size] for i in range(0, len(blocks), size)]
        for i, unit in enumerate(units):
            # The last unit's backward follows its forward at once: re-gathering its weights would only cost.
            reshard = plan.reshard_after_forward and i < len(units) - 1
            # A unit of one block is sharded as the block itself, so one block per unit is FSDP2 as it was before.
            fully_shard(unit[0] if len(unit) == 1 else unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        # The embedding, final norm and lm_head. FSDP2 never reshards the root after forward.
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if plan.keep_gathered_weights:
            keep_gathered_weights(model)
            mark_buffers_static(model)
        return model
    return compiled


def gradient_sync(train_model: nn.Module, plan: ParallelPlan, last_micro_batch: bool, averaged_after: bool = False):
    """The context a micro-batch's forward and backward run in: under DDP, all micro-batches but the last skip the
    all-reduce and accumulate locally; with `averaged_after` (the sums kept outside CUDA graphs' memory and averaged
    after the last micro-batch: graph_accumulation_reduce) every one does. FSDP2 reduce-scatters every micro-batch,
    keeping only sharded gradients between them (its memory saving), so it needs nothing here."""
    if plan.mode == DDP and (averaged_after or not last_micro_batch):
        return train_model.no_sync()
    return contextlib.nullcontext()


def graph_accumulation_reduce(plan: ParallelPlan) -> Callable[[list[torch.Tensor]], None] | None:
    """What averages a step's gradient sums over the ranks when they are accumulated outside CUDA graphs' memory
    (training/accumulation.py): under DDP, `average_over_ranks` in buckets of the run's DDP bucket size; None in one
    process. (FSDP2 with CUDA graphs and accumulation is refused: build.check_cuda_graphs_request.)"""
    if plan.mode != DDP:
        return None
    return functools.partial(average_over_ranks, bucket_bytes=plan.ddp_bucket_mb * 2**20)


@torch.no_grad()
def average_over_ranks(tensors: list[torch.Tensor], bucket_bytes: int) -> None:
    """Average `tensors` over the ranks in place, the same list (shapes, dtypes, order) on every rank: consecutive
    tensors of one dtype flattened into buckets of about `bucket_bytes`, one all-reduce per bucket."""
    buckets: list[list[torch.Tensor]] = []
    filled = 0
    for tensor in tensors:
        if not buckets or tensor.dtype != buckets[-1][0].dtype or filled + tensor.nbytes > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(tensor)
        filled += tensor.nbytes
    for bucket in buckets:
        flat = all_reduce_(torch.cat([t.reshape(-1) for t in bucket]), "avg")
        parts = flat.split([t.numel() for t in bucket])
        torch._foreach_copy_(bucket, [part.view_as(t) for part, t in zip(parts, bucket, strict=True)])
