"""Throughput sweep: precision x compile mode x attention x activation checkpointing x batch size x preset x world
size (one GPU, or several under torchrun with DDP or FSDP2).

Every configuration runs in a fresh process (`python -m cs336_basics.sweep.worker`; for a world size above 1,
that many under `torchrun --standalone`), so one configuration's compiled graphs, allocator state, OOM or crash cannot
touch the next. Each result is appended to OUT_DIR/sweep.json (results.append_runs: atomic) as soon as it exists, so a
killed sweep keeps what it measured; sweep.csv and sweep.md are rewritten after every configuration, sweep.png at the
end.

Configurations are ordered so that each group's baseline (BF16 + torch.compile default mode, same preset, batch,
attention, AC and world size) runs first: every record gets its speedup over that baseline when it is appended, and a
run on several GPUs its scaling over the same configuration on one (the one-GPU groups run first).

The command line is cli.py (optimize_performance.py runs its `main`); plan.py, run.py and report.py its stages. This
face imports none of them: the worker and the LoRA analysis run as `python -m cs336_basics.sweep.<module>`, and the
command line imports both, so a face that imported it would load them once more before runpy runs them as __main__.
"""
