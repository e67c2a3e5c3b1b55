#!/usr/bin/env bash
# The device commands of this record, in the order they ran, all on 2 x H200 (nvidia-h200-x2); commands 1-2 on one
# machine (main at 30a9b6c), 3-4 on another (main at 8f41023, which adds --fsdp_forward_prefetch). Each `run` began
# with the GUIDE recipe:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

### Command 1: first runs of auto's FSDP2 configuration, 2 a side (auto-first-runs/)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
timeout 570 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 2 --parallel fsdp --out_dir $OUT/fsdp2 > $OUT/fsdp2.log 2>&1; echo rc $?

### Command 2 (same machine, right after): the 2-GPU distributed GPU tests, then dynamo's guard checks skipped (probe/)
timeout 300 python3 -m pytest -q -m gpu tests/test_distributed.py -k "not four" > $OUT/tests.log 2>&1; echo tests rc $?
T="torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --warmup 6 --steps 12 --parallel fsdp --compile default"
timeout 270 $T --precisions bf16,fp8 --fp8_path fused --skip_guard_eval off,on --json $OUT/guards.json > $OUT/guards.log 2>&1; echo rc $?

### Command 3 (another machine): --fsdp_forward_prefetch, first runs, 2 a side; then FSDP2's own order, 1 a side (prefetch/, prefetch-own/)
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
S="--presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --compile auto --world_sizes 2 --parallel fsdp"
timeout 340 python3 optimize_performance.py $S --repeats 2 --fsdp_forward_prefetch --out_dir $OUT/prefetch > $OUT/prefetch.log 2>&1; echo rc $?
timeout 200 python3 optimize_performance.py $S --repeats 1 --out_dir $OUT/own > $OUT/own.log 2>&1; echo rc $?

### Command 4 (same machine, right after): batch 16 per GPU, DDP and FSDP2, one run each (batch16/)
timeout 370 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 10 --timeout_s 140 --compile auto --world_sizes 2 --parallel ddp,fsdp --batch_sizes 16 --out_dir $OUT/bs16 > $OUT/bs16.log 2>&1; echo rc $?
