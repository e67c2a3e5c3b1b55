# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130, main at bb03adc. Two nvidia-h200-x4 requests on one
# machine, one after the other (4 x H200, 143,771 MiB each, 64 CPU cores). The lanes (python -m lab.lanes) ran each
# job on the GPUs it names; .ab/ (carried) held the jobs files and .ab/call1.sh, which is the one reproduced in
# ../2026-11-28-ddp-levers-4xh200/device-commands.sh but for `--gpus ${GPUS:-4}` (4 here), and .ab/summary.py (the
# same file as there).

# Command A (ddp4-366m/, x1-vs-x4/; logs.tar.xz: logs/command-a/):
# .ab/s55-a.jobs:
#   ddp4-366m   4  python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel ddp --out_dir $JOB_OUT
#   x1-vs-x4    4  python3 optimize_performance.py --presets 1.3b --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 1,4 --parallel ddp --out_dir $JOB_OUT
LANES_S=580 JOB_S=575 bash .ab/call1.sh s55-a

# Command B (logs.tar.xz: logs/command-b/; the lanes were stopped at 575 s, so fsdp4-bs4 had only started and no
# lanes.json was written):
# .ab/s55-b.jobs:
#   chain4      4  python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_distributed.py -k four
#   fsdp4-bs4   4  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel fsdp --out_dir $JOB_OUT
LANES_S=575 JOB_S=570 bash .ab/call1.sh s55-b; grep -h "passed\|failed" $OUT/lanes/chain4.log | tail -3

# A third request (the fused chain alone after the fix, commit 86291cc, then FSDP2 x4 one run a side) was refused:
# no 4-GPU machine was lent any more.
