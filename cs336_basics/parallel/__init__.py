"""Training on several GPUs (several processes started by torchrun): world.py (which process this is, the process
group, collectives), wrap.py (--parallel: DDP or FSDP2, compile), fsdp_graphs.py (what CUDA graphs need under FSDP2)
and shards.py (sharded parameters as local tensors). Sharded checkpoints are training/sharded_checkpoint.py's; their
export as one file is programs/export.py's.

Kept import-free here: a single-process run imports none of torch.distributed's heavier modules.
"""
