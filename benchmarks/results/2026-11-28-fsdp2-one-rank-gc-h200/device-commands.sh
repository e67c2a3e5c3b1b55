# The device command behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130, triton 3.6.0. One nvidia-h200 request (1 x H200,
# 16 CPU cores, 1 thread per core), main at 75bdb03 (--gc_every then existed: 59efdd9; removed after this record).
# Run as `bash callB.sh`; logs.tar.xz holds each run's log; fsdp2-one-rank.json the three runs' result.json records.
#
# callB.sh:
# h200 one GPU: FSDP2 on one rank (torchrun, 1 process), 1.3b FP8 (auto's path), first runs with empty caches:
# per-step host series with Python's collector (twice) and with --gc_every 50; is FSDP2's host step slowed by the collector?
nvidia-smi -L; lscpu | grep -i "^CPU(s)\|model name\|thread(s) per core"
M=$PWD; mkdir -p $OUT/x1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
C="--preset 1.3b --batch_size 4 --max_steps ${STEPS:-42} --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp"
for arm in ${ARMS:-gc0-a:0 gc50:50 gc0-b:0}; do
  name=${arm%%:*}; every=${arm#*:}; caches=$(mktemp -d); mkdir -p $caches/tmp
  TORCHINDUCTOR_CACHE_DIR=$caches/inductor TRITON_CACHE_DIR=$caches/triton TMPDIR=$caches/tmp timeout -k 5 ${RUN_S:-170} \
    python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_h100.py $C --gc_every $every --out_dir $OUT/x1/$name > $OUT/x1/$name.log 2>&1
  echo "$name rc $?"; rm -rf $caches
done
cd $OUT && tar cJf x1.tar.xz x1 && python3 - <<'PY'
import json, glob, statistics as st
for p in sorted(glob.glob("x1/*/result.json")):
    r = json.load(open(p)); s = r["step_ms"]; h, c, g = r["host_ms"][0], r["host_cpu_ms"][0], r["gc_ms"][0]
    print(f"{p}: {r['precision']} gc_every {r.get('gc_every')} tok/s {r['tokens_per_sec']:,.0f} compile {r['compile_s']:.0f} peak {r['peak_mem_gib']:.2f} step med {st.median(s):.1f} p10 {r['step_ms_p10']:.1f} p90 {r['step_ms_p90']:.1f} host med {st.median(h):.1f} cpu med {st.median(c):.1f} gc sum {sum(g):.1f} max {max(g):.1f}")
    for name, v in (("step", s), ("host", h), ("cpu", c), ("gc", g)):
        print(f"   {name:5}", " ".join(f"{x:.0f}" for x in v))
PY
#
# Then, in a second nvidia-h200 request (another machine: 1 x H200, 16 CPU cores), main at 88ccd31 (host-profile.json,
# logs/host-profile.log):
timeout -k 5 260 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile auto --precisions fp8 --steps 10 --top_python 30 --json $OUT/pyprof.json > $OUT/pyprof.log 2>&1
#
# Then a third nvidia-h200 request (1 x H200, 16 CPU cores), main at 64b96d6 (logs/gpu-tests.log, host-ops.json,
# logs/host-ops.log):
timeout -k 5 280 python3 -m pytest -m gpu -p no:cacheprovider -v --durations=10 tests/test_train_cli.py tests/test_accumulation.py tests/test_gc_pauses.py > $OUT/tests.log 2>&1
timeout -k 5 170 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile auto --precisions fp8 --steps 10 --top_ops 30 --json $OUT/ops.json > $OUT/ops.log 2>&1
