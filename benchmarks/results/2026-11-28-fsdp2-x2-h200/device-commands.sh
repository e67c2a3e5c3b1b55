#!/usr/bin/env bash
# The device commands of this record, in the order they ran (main at 4be00b7 plus the lab.host_time --parallel and
# --fp8_path options of the next commit). Each `run` began with the GUIDE recipe:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

### Command 1 (nvidia-h200-x2): the probe (it measured one process per rank: README, finding 3)
# FSDP2 x2 at 1.3b: where the step's time goes, BF16 and each FP8 path, no CUDA graphs; then the fused path under CUDA graphs.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T="torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --parallel fsdp --warmup 6 --steps 12 --top_ops 25"
timeout 380 $T --precisions bf16,fp8 --fp8_path torchao,fused --compile default --json $OUT/fsdp-default.json > $OUT/fsdp-default.log 2>&1; echo rc $?
timeout 180 $T --precisions fp8 --fp8_path fused --compile reduce-overhead --json $OUT/fsdp-graphs.json > $OUT/fsdp-graphs.log 2>&1; echo rc $?
grep -v "^\[rank1\]" $OUT/fsdp-default.log | grep -A26 "tok/s" | cut -c1-400
grep -i "error\|Traceback\|skip" $OUT/fsdp-graphs.log | head -5; grep -A26 "tok/s" $OUT/fsdp-graphs.log | cut -c1-400

### Command 2 (nvidia-h200-x2, same machine): the cold sweep
# FSDP2 x2 at 1.3b, first runs: BF16, TorchAO's path (auto's choice at a162...), the fused path with delayed scaling.
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; print(prepare_data(DataConfig(), 32000).description)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 560 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8-tensorwise,fp8-fused-delayed --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 2 --parallel fsdp --out_dir $OUT/fsdp2 > $OUT/fsdp2.log 2>&1; echo rc $?
cd $OUT && tar cJf fsdp2.tar.xz fsdp2 fsdp2.log && python3 $OLDPWD/.ab/summary.py fsdp2

### Command 3 (nvidia-h200): GC timed, one GPU. .diag/gc_probe.py, as it ran:
: <<'GC_PROBE_PY'
"""Diagnosis: do Python's garbage collections slow a host-bound step after compile? Runs train_h100.main with GC
timed per generation from the first step's end; GC_FREEZE=1 also gc.freeze()s after the first (compiling) step."""
import gc, os, sys, time
import train_h100
from cs336_basics.training import trainer as T

stats = {"on": False, 0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0], "big": []}
t0 = [0.0]
def cb(phase, info):
    if phase == "start":
        t0[0] = time.perf_counter()
    elif stats["on"]:
        g = info["generation"]; ms = (time.perf_counter() - t0[0]) * 1e3
        stats[g][0] += 1; stats[g][1] += ms
        if ms > 2: stats["big"].append((g, round(ms, 1), info["collected"]))
gc.callbacks.append(cb)
orig = T.Trainer._timed_step
def timed(self, timer, progress):
    r = orig(self, timer, progress)
    if self.step == progress.first_step + 1:
        if os.environ.get("GC_FREEZE") == "1":
            gc.freeze()
        stats["on"] = True
        print("objects tracked after first step:", len(gc.get_objects()), "frozen", gc.get_freeze_count(), flush=True)
    return r
T.Trainer._timed_step = timed
rc = train_h100.main(sys.argv[1:])
if os.environ.get("RANK", "0") == "0":
    print("GC after first step: gen0 %d %.1f ms, gen1 %d %.1f ms, gen2 %d %.1f ms; >2ms: %s" % (
        stats[0][0], stats[0][1], stats[1][0], stats[1][1], stats[2][0], stats[2][1], stats["big"][:20]), flush=True)
sys.exit(rc)
GC_PROBE_PY
# One H200: host-bound modes, cold, 50 steps: per-interval tok/s with GC timed, plain and with gc.freeze() after step 1.
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
one() { # name, launcher, args...
  name=$1; shift; c=$(mktemp -d); mkdir -p $c/tmp
  TORCHINDUCTOR_CACHE_DIR=$c/ind TRITON_CACHE_DIR=$c/tri TMPDIR=$c/tmp timeout 150 "$@" --max_steps 50 --log_every 5 --eval_every 0 --checkpoint_every 0 --attention sdpa --no_gradient_checkpointing --out_dir $OUT/run-$name > $OUT/$name.log 2>&1; echo "$name rc $?"
  grep "GC after\|objects tracked\|^done\|rror" $OUT/$name.log | cut -c1-500
  python3 -c "import json;print([round(json.loads(l)['tokens_per_sec']) for l in open('$OUT/run-$name/metrics.jsonl')])"
}
for fr in 0 1; do
  GC_FREEZE=$fr one 366m-fp8-$fr python3 .diag/gc_probe.py --preset 366m --compile_mode default --fp8_path fused
  GC_FREEZE=$fr one 366m-bf16-$fr python3 .diag/gc_probe.py --preset 366m --compile_mode default --no_use_fp8
done
for fr in 0 1; do
  GC_FREEZE=$fr one fsdp1-fp8-$fr torchrun --standalone --nproc_per_node 1 .diag/gc_probe.py --preset 1.3b --parallel fsdp --fp8_path fused
done
cd $OUT && tar cJf gc.tar.xz *.log run-*/metrics.jsonl && rm -rf run-* *.log

### Command 4 (nvidia-h200, same machine): inductor's compile worker pool off and on
# One H200, FSDP2 on one rank (host-bound), cold, 50 steps: inductor's compile worker pool on (default) or off.
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
one() { name=$1; shift; c=$(mktemp -d); mkdir -p $c/tmp
  TORCHINDUCTOR_CACHE_DIR=$c/ind TRITON_CACHE_DIR=$c/tri TMPDIR=$c/tmp timeout 100 "$@" --max_steps 50 --log_every 5 --eval_every 0 --checkpoint_every 0 --attention sdpa --no_gradient_checkpointing --out_dir $OUT/run-$name > $OUT/$name.log 2>&1; echo "$name rc $?"
  grep "^done\|rror" $OUT/$name.log | cut -c1-300; ps -eo pid,pcpu,comm --sort=-pcpu | head -4
  python3 -c "import json;print([round(json.loads(l)['tokens_per_sec']) for l in open('$OUT/run-$name/metrics.jsonl')])"; }
for th in 1 default; do for p in "--fp8_path fused" "--no_use_fp8"; do
  if [ $th = 1 ]; then export TORCHINDUCTOR_COMPILE_THREADS=1; else unset TORCHINDUCTOR_COMPILE_THREADS; fi
  one "th$th-${p##* }" torchrun --standalone --nproc_per_node 1 train_h100.py --preset 1.3b --parallel fsdp $p
done; done

### Command 5 (nvidia-h200-x2, a fresh machine): 60 steps through train_h100.py
# FSDP2 x2 1.3b cold through train_h100.py itself, 60 steps: tok/s per 5-step interval (is the sweep's 20 too short?).
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
for p in "--fp8_path fused" "--no_use_fp8"; do name=${p##* }; c=$(mktemp -d); mkdir -p $c/tmp
  TORCHINDUCTOR_CACHE_DIR=$c/ind TRITON_CACHE_DIR=$c/tri TMPDIR=$c/tmp timeout 85 torchrun --standalone --nproc_per_node 2 train_h100.py --preset 1.3b --parallel fsdp $p --max_steps 60 --log_every 5 --eval_every 0 --checkpoint_every 0 --attention sdpa --no_gradient_checkpointing --out_dir /tmp/run-$name > $OUT/$name.log 2>&1; echo "$name rc $?"
  grep "^done" $OUT/$name.log | cut -c1-200; cp /tmp/run-$name/metrics.jsonl $OUT/$name.metrics.jsonl
  python3 -c "import json;print([round(json.loads(l)['tokens_per_sec']) for l in open('/tmp/run-$name/metrics.jsonl')])"
done
