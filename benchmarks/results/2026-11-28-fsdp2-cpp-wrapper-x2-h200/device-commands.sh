#!/usr/bin/env bash
# The device commands of this record, in the order they ran (main at 083e50d; command 2 also with the
# lab.host_time --fsdp_reshard_after_forward option of the commit that adds this record). Each `run` began with the
# GUIDE recipe:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

### Command 1 (nvidia-h200-x2, machine A): the probe under FSDP2 (probe/)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
T="torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --warmup 6 --steps 12 --top_ops 30"
timeout 420 $T --parallel fsdp --precisions bf16,fp8 --fp8_path torchao,fused --compile default --json $OUT/fsdp.json > $OUT/fsdp.log 2>&1; echo rc $?
timeout 150 $T --parallel fsdp --precisions fp8 --fp8_path fused --compile reduce-overhead --json $OUT/fsdp-graphs.json > $OUT/fsdp-graphs.log 2>&1; echo rc $?
grep -v "^\[rank1\]" $OUT/fsdp.log | grep -A31 "tok/s" | cut -c1-300; grep -A31 "tok/s" $OUT/fsdp-graphs.log | cut -c1-300

### Command 2 (nvidia-h200-x2, machine B): the C++ wrapper and reshard-after-forward, warm probe steps (screen/)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
T="torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --warmup 6 --steps 12"
timeout 570 $T --parallel fsdp --precisions bf16,fp8 --fp8_path fused --compile default --compile_wrappers python,cpp --fsdp_reshard_after_forward on,off --json $OUT/screen.json > $OUT/screen.log 2>&1; echo rc $?
grep "tok/s" $OUT/screen.log | grep -v "^\[rank1\]" | cut -c1-330

### Command 3 (nvidia-h200-x2, machine C): the 2-GPU loss parity, recorded in ../2026-11-28-parity-seed-spread-x2-h200/

### Command 4 (nvidia-h200-x2, machine C, right after command 3): first runs through train_h100.py (trainer/)
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
run() { name=$1; shift; c=$(mktemp -d); mkdir -p $c/tmp
  TORCHINDUCTOR_CACHE_DIR=$c/ind TRITON_CACHE_DIR=$c/tri TMPDIR=$c/tmp timeout 125 torchrun --standalone --nproc_per_node 2 train_h100.py --preset 1.3b --parallel fsdp "$@" --max_steps 60 --log_every 5 --eval_every 0 --checkpoint_every 0 --attention sdpa --no_gradient_checkpointing --out_dir /tmp/run-$name > $OUT/$name.log 2>&1; echo "$name rc $?"
  grep "^done" $OUT/$name.log | cut -c1-200; cp /tmp/run-$name/metrics.jsonl $OUT/$name.metrics.jsonl
  python3 -c "import json;print([round(json.loads(l)['tokens_per_sec']) for l in open('/tmp/run-$name/metrics.jsonl') if 'tokens_per_sec' in l])"; }
run bf16 --no_use_fp8
run fused-cpp --fp8_path fused --compile_wrapper cpp
run fused-python --fp8_path fused --compile_wrapper python
