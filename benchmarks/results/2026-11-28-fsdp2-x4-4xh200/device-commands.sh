# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130, main at 24b12b2. Four nvidia-h200-x4 requests, one
# after the other: A, B and C on one machine, D on a fresh one (4 x H200, 143,771 MiB each, 64 CPU cores). A and B
# ran their jobs with the lanes (python -m lab.lanes) through .ab/call1.sh, the file reproduced in
# ../2026-11-28-ddp-levers-4xh200/device-commands.sh but for `--gpus ${GPUS:-4}` (4 here).

# Command A (logs.tar.xz: logs/command-a/). The lanes' `timeout` (585 s) ended the lanes during fsdp4-bs4's second
# BF16 run; the sweep, in a session of its own, was not stopped and went on (see the README):
# .ab/s55-c.jobs:
#   chain4-fused 4  python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_distributed.py -k "four and fused"
#   fsdp4-bs4    4  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel fsdp --out_dir $JOB_OUT
LANES_S=585 JOB_S=420 bash .ab/call1.sh s55-c

# Command B (fsdp4-bs4/; logs.tar.xz: logs/command-b/), fired as A returned, on the same machine:
# .ab/s56-a.jobs:
#   fsdp4-bs4   4  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel fsdp --out_dir $JOB_OUT
LANES_S=590 JOB_S=585 bash .ab/call1.sh s56-a

# Command C (ddp2-comm/; logs.tar.xz: logs/command-c/), the same machine, GPUs 0 and 1:
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
timeout 240 python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_distributed.py -k "not four" > $OUT/distributed-tests.log 2>&1; tail -1 $OUT/distributed-tests.log
timeout 300 torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --compile auto --precisions bf16,fp8 --grad_sync on,off --json $OUT/ddp-comm.json > $OUT/ddp-comm.log 2>&1; echo "probe rc $?"; tail -8 $OUT/ddp-comm.log

# Command D (fsdp4-host/; logs.tar.xz: logs/command-d/), a fresh machine:
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; timeout 270 torchrun --standalone --nproc_per_node 4 -m lab.host_time --presets 1.3b --compile auto --precisions bf16,fp8 --parallel fsdp --top_ops 10 --json $OUT/fsdp4-host.json > $OUT/fsdp4-host.log 2>&1; echo "probe rc $?"; grep -v "train:" $OUT/fsdp4-host.log | grep -v -i warn | tail -40
