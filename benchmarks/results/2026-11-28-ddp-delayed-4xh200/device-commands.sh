# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130. Three nvidia-h200-x4 requests (4 x H200, 143,771 MiB
# each, 64 CPU cores); commands 1 and 2 on one machine, one after the other, command 3 on a fresh one. Commands 1 and 2
# ran main at c18ab78; command 3 the same with this commit's package and test changes (the fused path's delayed
# scaling as the default on several processes, so that its `fp8` is delayed). The lanes (python -m lab.lanes) ran
# each job on GPUs of its own; .ab/ (carried) held the jobs files and two helpers: .ab/call1.sh and .ab/summary.py
# are reproduced verbatim in ../2026-11-28-ddp-levers-4xh200/device-commands.sh, unchanged since.

# Command 1 (x2-cold/, x2-parity/; logs.tar.xz: command1/):
# .ab/call-a.jobs:
#   # #55 lever: delayed scaling under DDP x2 against today's default (dynamic), both with the FP8 head, first runs.
#   ddp2-scaling 2  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8,fp8-fused-delayed --fp8_lm_head on --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   # #55's loss parity on 2 GPUs (1.3b, 200 steps on real text): BF16, the default FP8 (dynamic under DDP), delayed.
#   parity2      2  python3 -m lab.loss_parity --out_dir $JOB_OUT --variants bf16,fp8,fp8-fused-delayed+lm_head --preset 1.3b --nproc_per_node 2 --max_steps 200 --eval_every 50 --eval_batches 16 --log_every 10 --checkpoint_every 0
#   hosttests    1  python3 -m pytest -q -m gpu tests/test_host_time.py
git log --oneline -1; LANES_S=560 JOB_S=555 bash .ab/call1.sh call-a

# Command 2 (x4-cold/; logs.tar.xz: command2/):
# .ab/call-b.jobs:
#   # #55 lever on 4 GPUs: delayed scaling under DDP x4 against today's default (dynamic), both with the FP8 head, first runs.
#   ddp4-scaling 4  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8,fp8-fused-delayed --fp8_lm_head on --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel ddp --out_dir $JOB_OUT
git log --oneline -1; LANES_S=540 JOB_S=535 bash .ab/call1.sh call-b

# Command 3 (x2-accumulation/; logs.tar.xz: command3/, tests2.log the GPU tests):
# .ab/call-c.jobs:
#   # #55: the mode matrix's DDP accumulation row for the delayed default (fp8 = auto's choice, now delayed) against dynamic.
#   ddp2-accum4 2  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8,fp8-fused-dynamic --fp8_lm_head on --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --gradient_accumulation_steps 4 --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   # The 2-GPU tests on the flipped default (the 4-GPU chain needs the whole host: not in this call).
#   tests2 2  python3 -m pytest -v -m gpu tests/test_distributed.py -k "not four"
git log --oneline -1; git diff --stat | tail -1; LANES_S=550 JOB_S=545 bash .ab/call1.sh call-c; tail -15 $OUT/lanes/tests2.log
