#!/usr/bin/env bash
# The device command of this record (nvidia-h200-x2, main at 083e50d), after the GUIDE recipe:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# It prepared the stdlib data, then ran one lanes job on GPUs 0,1 (python3 -m lab.lanes --gpus 2 --timeout_s 470),
# whose command was:
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; print(prepare_data(DataConfig(), 32000).description)"
python3 -m lab.loss_parity --out_dir $OUT/lanes/parity2s --variants bf16,fp8-fused-delayed+lm_head --seed_spread 1 \
  --preset 1.3b --nproc_per_node 2 --max_steps 200 --eval_every 50 --eval_batches 16 --log_every 10 --checkpoint_every 0
