# The device commands behind this record, verbatim, in order. Four nvidia-h200 requests (1 x H200, 16 vCPUs, KVM
# guest): call 1 on one machine (GPU-96ff496c), calls 2-3 on a second (GPU-74047222), call 4 on a third (GPU-ec4ac5bb). torch 2.11.0+cu130, triton
# 3.6.0, torchao 0.18.0 (its wheel carried in .whl). carry: [".whl", ".ab"].
# Call 1 ran main at 9e4d0e6 (reshard after forward on by default); calls 2-3 ran 6ac9f5c (auto: off under CUDA graphs).
#
# call 1 (GPU tests on 9e4d0e6; then reshard on/off under CUDA graphs, FSDP2 on one rank, in both orders):
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; nvidia-smi -L; mkdir -p $OUT/c1; cd $PWD
(time timeout 280 python3 -m pytest -v -m gpu tests/test_distributed.py -k fsdp2_under_cuda_graphs) > $OUT/c1/t1.log 2>&1; echo "t1 rc $?"; tail -4 $OUT/c1/t1.log
(time timeout 250 python3 -m pytest -v -m gpu tests/test_accumulation.py tests/test_verify_fp8.py) > $OUT/c1/t2.log 2>&1; echo "t2 rc $?"; tail -6 $OUT/c1/t2.log
for r in on,off off,on; do timeout 200 torchrun --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile reduce-overhead --precisions fp8 --fsdp_reshard_after_forward $r --steps 20 --json $OUT/c1/reshard-$r.json > $OUT/c1/reshard-$r.log 2>&1; echo "hs $r rc $?"; grep -E "tok/s|host" $OUT/c1/reshard-$r.log | tail -4; done
cd $OUT && tar cJf c1.tar.xz c1
#
# call 2 (6ac9f5c): the script below as first written (no NOTEST switch; run folders named by arm alone: on, auto)
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash .ab/reshard.sh 2>&1
# call 3 (6ac9f5c): two more pairs, the other order first, no test
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; NOTEST=1 ARMS="auto on auto on" bash .ab/reshard.sh 2>&1
# call 4 (98be018, GPU-ec4ac5bb, a third machine): the GPU tests of the session's later commits
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; nvidia-smi -L; mkdir -p $OUT/c4; (time timeout 470 python3 -m pytest -v -p no:cacheprovider -m gpu --durations 10 tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_lora.py tests/test_train_cli.py) > $OUT/c4/gpu-tests.log 2>&1; echo "rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/c4/gpu-tests.log | tail -30
#
# ===== .ab/reshard.sh (as in call 3)
#   # h200 one GPU: (1) the FSDP2 CUDA-graph GPU test on this tree (auto now keeps gathered weights for backward under
#   # graphs); (2) FSDP2 on one rank (torchrun, one process), 1.3b batch 4, --compile_mode reduce-overhead, first runs
#   # (empty caches): reshard after forward on (asked) against auto (off under graphs): tok/s, peak, loss.
#   nvidia-smi -L; M=$PWD; mkdir -p $OUT/c2
#   [ -z "$NOTEST" ] && (time timeout 260 python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_distributed.py -k fsdp2_under_cuda_graphs) > $OUT/c2/test.log 2>&1
#   [ -z "$NOTEST" ] && echo "test rc $?" && grep -E "PASSED|FAILED|passed|failed" $OUT/c2/test.log | tail -4
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   A="--preset 1.3b --batch_size 4 --max_steps 40 --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp --use_fp8 --compile_mode reduce-overhead"
#   i=0; for arm in ${ARMS:-on auto}; do i=$((i+1))
#     R=""; [ $arm = on ] && R="--fsdp_reshard_after_forward"; [ $arm = off ] && R="--no_fsdp_reshard_after_forward"
#     C=$(mktemp -d); mkdir -p $C/tmp
#     TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton TMPDIR=$C/tmp timeout -k 5 ${RUN_S:-170} \
#       python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_h100.py $A $R --out_dir $OUT/c2/$arm$i > $OUT/c2/$arm$i.log 2>&1
#     echo "$arm$i rc $?"; grep -o "blocks [a-z-]* their [a-z ]*weights[^;]*" $OUT/c2/$arm$i.log | head -1; python3 $M/.ab/row.py $OUT/c2/$arm$i/result.json
#   done
#   cd $OUT && tar cJf c2.tar.xz c2 && rm -rf c2
# ===== .ab/row.py (prints a result.json's line)
#   import json, sys, statistics as st
#   try:
#       r = json.load(open(sys.argv[1]))
#   except OSError as e:
#       sys.exit(f"   no result: {e}")
#   s = r["step_ms"]; h = r["host_ms"][0]; c = r["host_cpu_ms"][0]
#   print(f"   {r['precision']} tok/s {r['tokens_per_sec']:,.0f} compile {r['compile_s']:.0f} peak {r['peak_mem_gib']:.2f} "
#         f"step med {st.median(s):.1f} p10 {r['step_ms_p10']:.1f} p90 {r['step_ms_p90']:.1f} host med {st.median(h):.1f} "
#         f"cpu med {st.median(c):.1f} loss {r.get('loss')}")
