"""Training on several GPUs (several processes started by torchrun): world.py (which process this is, the process
group, collectives), wrap.py (--parallel: DDP or FSDP2, compile), shards.py (sharded parameters as local tensors),
checkpoint.py (sharded checkpoints with torch.distributed.checkpoint) and export.py (a sharded checkpoint as one file).

Kept import-free here: a single-process run imports none of torch.distributed's heavier modules.
"""
