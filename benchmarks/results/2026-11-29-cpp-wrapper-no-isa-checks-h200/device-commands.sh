# The device commands behind this record, verbatim, in order. Four nvidia-h200 requests (1 x H200, 16 vCPUs, KVM
# guest); calls 1 and 2 ran on one machine (GPU-db6e2183), call 3 on a freshly started other one (GPU-ba61a373), call 4 on a third (GPU-82323e60).
# Arms: "main" is main at 246ce34; "branch" is 58cb06b (cs336_basics.compiled.compile_options sets cpp.vec_isa_ok
# False for a CUDA run's C++ wrapper), its tree copied to .ab/branch with
#   git archive 58cb06b cs336_basics train_h100.py optimize_performance.py verify_fp8_compilation.py tests lab pyproject.toml | tar x -C .ab/branch
# torch 2.11.0+cu130, triton 3.6.0, torchao 0.18.0 (its wheel carried in .whl). carry: [".whl", ".ab"].
#
# call 1:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; bash .ab/wrapab.sh 2>&1
# call 2:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; bash .ab/fsdpab.sh 2>&1
# call 3 (the other order, FP8 only, no tests):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; ARMS="branch main" PRECS=fp8 W=w2 bash .ab/wrapab.sh 2>&1; ARMS="branch main" F=f2 NO_TEST=1 RUN_S=170 bash .ab/fsdpab.sh 2>&1
#
# cpp-wrapper-no-isa-checks.json gathers every run's record (the sweeps' sweep.json rows and the FSDP2 runs'
# result.json), each with arm, code, device_call and gpu_uuid added; logs.tar.xz has each run's log and the GPU test's.
# call 4 (BF16 again; .ab/branch then held main at 246ce34, the old code, from
#   git archive 246ce34 cs336_basics train_h100.py optimize_performance.py verify_fp8_compilation.py tests lab pyproject.toml | tar x -C .ab/branch
# and the checkout main at b1345ce, the new code: so in this call the script's "main" arm ran the new code and its
# "branch" arm the old; the JSON's arm field names the code, not the script's label):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; ARMS="main branch" PRECS=bf16 W=w3 bash .ab/wrapab.sh 2>&1
#
# (Calls 1 and 2 ran the scripts before W/F/ARMS/NO_TEST became variables; their defaults are what those calls ran.)
#
# ===== .ab/wrapab.sh
#   # h200 one GPU: the C++ wrapper without vector-ISA checks (branch cpp-wrapper-no-vec-isa, a copy in .ab/branch) against
#   # main in the mode matrix's no-CUDA-graphs row (366m BF16 and FP8, --compile default, where auto picks the C++ wrapper
#   # for both), first runs (--cold): compile_s and tok/s per arm; arms take turns per precision.
#   nvidia-smi -L; M=$PWD; mkdir -p $OUT/${W:-w}
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   S="--presets 366m --attention sdpa --ac off --steps 20 --cold --compile default --timeout_s 200"
#   for p in ${PRECS:-fp8 bf16}; do for arm in ${ARMS:-main branch}; do
#     D=$M; [ $arm = branch ] && D=$M/.ab/branch
#     (cd $D && PYTHONPATH=/tmp/site:$D python3 optimize_performance.py $S --precisions $p --out_dir $OUT/${W:-w}/$arm-$p > $OUT/${W:-w}/$arm-$p.log 2>&1)
#     echo "$arm-$p rc $?"
#     python3 -c "
#   import json; d = json.load(open('$OUT/${W:-w}/$arm-$p/sweep.json'))
#   for r in d['runs']: print('   $arm', r['precision'], r['compile_wrapper'], r['status'], 'tok/s', round(r['tokens_per_sec'] or 0), 'compile_s', r['compile_s'], 'step', r['step_time_ms'])" 2>&1 | tail -3
#     (cd $OUT && tar cJf ${W:-w}.tar.xz ${W:-w})
#   done; done
# ===== .ab/fsdpab.sh
#   # h200 one GPU: FSDP2 on one rank (torchrun, one process: FSDP2's hooks and host work per step as on several), 1.3b
#   # FP8 batch 4 (auto: fused path, C++ wrapper), main against branch cpp-wrapper-no-vec-isa, each with empty caches;
#   # then the branch's GPU tests of the C++ wrapper.
#   nvidia-smi -L; M=$PWD; mkdir -p $OUT/${F:-f}
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   A="--preset 1.3b --batch_size 4 --max_steps ${STEPS:-40} --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp"
#   for arm in ${ARMS:-main branch}; do
#     D=$M; [ $arm = branch ] && D=$M/.ab/branch; C=$(mktemp -d); mkdir -p $C/tmp
#     (cd $D && PYTHONPATH=/tmp/site:$D TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton TMPDIR=$C/tmp timeout -k 5 ${RUN_S:-200} \
#       python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_h100.py $A --out_dir $OUT/${F:-f}/$arm > $OUT/${F:-f}/$arm.log 2>&1)
#     echo "$arm rc $?"; grep "^done" $OUT/${F:-f}/$arm.log; python3 $M/.ab/row.py $OUT/${F:-f}/$arm/result.json
#     (cd $OUT && tar cJf ${F:-f}.tar.xz ${F:-f})
#   done
#   [ -z "$NO_TEST" ] && (cd .ab/branch && PYTHONPATH=/tmp/site:$M/.ab/branch timeout -k 5 ${TEST_S:-150} python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_train_cli.py tests/test_config.py -k "cpp_wrapper or wrapper" > $OUT/${F:-f}/tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/${F:-f}/tests.log)
#   (cd $OUT && tar cJf ${F:-f}.tar.xz ${F:-f})
# ===== .ab/row.py
#   import json, sys, statistics as st
#   try:
#       r = json.load(open(sys.argv[1]))
#   except OSError as e:
#       sys.exit(f"   no result: {e}")
#   s = r["step_ms"]; h = r["host_ms"][0]; c = r["host_cpu_ms"][0]
#   print(f"   {r['precision']} tok/s {r['tokens_per_sec']:,.0f} compile {r['compile_s']:.0f} peak {r['peak_mem_gib']:.2f} "
#         f"step med {st.median(s):.1f} p10 {r['step_ms_p10']:.1f} p90 {r['step_ms_p90']:.1f} host med {st.median(h):.1f} "
#         f"cpu med {st.median(c):.1f} loss {r.get('loss')}")
