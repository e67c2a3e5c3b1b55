# The device commands behind this record, verbatim, in order. Eight nvidia-h200 requests (1 x H200, 16 vCPUs, KVM
# guest): calls 1-3 on one machine (GPU-392e4df2), calls 4-5 on a second (GPU-4c61b299), calls 6-7 on a third
# (GPU-c7a4d475), call 8 on a fourth (its UUID not printed). torch 2.11.0+cu130, triton 3.6.0, torchao 0.18.0 (its wheel carried in .whl). carry: [".whl", ".ab"].
# Calls 1-5 ran main at b2bf640 with the probe site below (.ab/resident_site, on PYTHONPATH: it patched torch and the
# package at start-up, in train_h100.py and lab.host_time processes only); calls 6-8 ran this change (no probe).
# Every train_h100.py run started with empty compile caches (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, TMPDIR fresh).
#
# call 1 (probe: gathered weights kept; buffers not marked, SB unset in this call's resident.sh):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; ARMS="fp8-ro-res fp8-auto bf16-auto" RUN_S=190 bash .ab/resident.sh 2>&1
# call 2 (buffers marked static in the fully_shard wrapper; it failed on FSDP2's units, which are lists: no results):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; ARMS="fp8-ro-res fp8-ro bf16-ro-res" RUN_S=170 F=r2 bash .ab/resident.sh 2>&1; grep -h "skipping cudagraphs\|rerecord\|re-record" $OUT/r2/*.log | cut -c1-250 | sort | uniq -c | head
# call 3 (the same, fixed for lists: buffers marked when sharded, before the Trainer re-registers the row buffers):
#   (call 2's command, the pip line ending "2>/dev/null;" instead of "&& ... || exit;")
# call 4 (every buffer marked: the row buffers also when (re-)registered; recordings counted):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; ARMS="fp8-ro-res fp8-ro" RUN_S=170 F=r3 bash .ab/resident.sh 2>&1; grep -h "skipping cudagraphs\|rerecord\|re-record" $OUT/r3/*.log | cut -c1-250 | sort | uniq -c | head
# call 5 (host time, probe on in both rows):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD:$PWD/.ab/resident_site PYTHONUNBUFFERED=1; python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1; RESIDENT=1 STATIC_BUFFERS=1 timeout -k 5 330 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile reduce-overhead,auto --precisions fp8 --steps 10 --json $OUT/ht.json > $OUT/ht.log 2>&1; echo rc $?; grep -v "^\[rank0\]:W" $OUT/ht.log | tail -25
# call 6 (this change; its GPU test, then host time; the -k filter also deselected test_train_cli's GPU tests):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; bash .ab/fsdpgraphs.sh 2>&1
# call 7 (this change; the Trainer's GPU tests):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT/g; timeout -k 5 330 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_train_cli.py tests/test_accumulation.py > $OUT/g/gpu-tests-2.log 2>&1; echo "tests rc $?"; tail -4 $OUT/g/gpu-tests-2.log
# call 8 (this change; reshard after forward on and off under CUDA graphs, a machine started afresh):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT/h; python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1; timeout -k 5 230 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile reduce-overhead --precisions fp8 --fsdp_reshard_after_forward on,off --steps 10 --json $OUT/h/reshard.json > $OUT/h/reshard.log 2>&1; echo rc $?; grep -v "^\[rank0\]:W" $OUT/h/reshard.log | grep "tok/s"
#
# fsdp2-cuda-graphs.json gathers every run's record (train_h100's result.json, lab.host_time's rows), each with
# arm, device_call, gpu_uuid, code, keep_gathered_weights and buffers_marked_static added; logs.tar.xz has the logs.
#
# ===== .ab/resident.sh (as in calls 2-4; call 1 without STATIC_BUFFERS)
#   # h200 one GPU: FSDP2 on one rank (torchrun, one process), 1.3b batch 4: CUDA graphs with FSDP2's gathered weights kept
#   # allocated (RESIDENT=1, .ab/resident_site) against auto (compile default, C++ wrapper for FP8), empty caches each run.
#   nvidia-smi -L; M=$PWD; mkdir -p $OUT/${F:-r}
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   A="--preset 1.3b --batch_size 4 --max_steps ${STEPS:-40} --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp"
#   for arm in ${ARMS:-fp8-ro-res fp8-auto}; do
#     prec=${arm%%-*}; rest=${arm#*-}; mode=auto; res=0
#     case $rest in ro-res) mode=reduce-overhead; res=1;; ro) mode=reduce-overhead;; esac
#     P="--use_fp8"; [ $prec = bf16 ] && P="--no_use_fp8"
#     C=$(mktemp -d); mkdir -p $C/tmp
#     STATIC_BUFFERS=${SB:-1} RESIDENT=$res PYTHONPATH=/tmp/site:$M:$M/.ab/resident_site TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton TMPDIR=$C/tmp timeout -k 5 ${RUN_S:-240} \
#       python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_h100.py $A $P --compile_mode $mode --out_dir $OUT/${F:-r}/$arm > $OUT/${F:-r}/$arm.log 2>&1
#     echo "$arm rc $?"; grep "^done\|PROBE" $OUT/${F:-r}/$arm.log; python3 $M/.ab/row.py $OUT/${F:-r}/$arm/result.json
#     (cd $OUT && tar cJf ${F:-r}.tar.xz ${F:-r})
#   done
# ===== .ab/resident_site/sitecustomize.py (as in call 5; call 4 had no lab.host_time in its first condition, calls 1-3 the earlier states described above)
#   """Probe only (not the package): in train_h100.py processes, RESIDENT=1 keeps FSDP2's gathered weights allocated
#   (their storage is never freed, so their addresses stay put), and every CUDA graph recording is counted."""
#   import atexit
#   import os
#   import sys
#   
#   if any(a.endswith("train_h100.py") or a == "lab.host_time" for a in sys.orig_argv) and "torch.distributed.run" not in sys.orig_argv:
#       import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param
#       from torch._inductor import cudagraph_trees
#   
#       if os.environ.get("RESIDENT") == "1":
#           fsdp_param.free_storage = lambda tensor: None
#       if os.environ.get("STATIC_BUFFERS") == "1":
#           import torch
#           import torch.distributed.fsdp as fsdp_package
#   
#           shard = fsdp_package.fully_shard
#   
#           def shard_with_static_buffers(module, *args, **kwargs):
#               for part in module if isinstance(module, list) else [module]:
#                   for buffer in part.buffers():
#                       torch._dynamo.mark_static_address(buffer)
#               return shard(module, *args, **kwargs)
#   
#           fsdp_package.fully_shard = shard_with_static_buffers
#           from cs336_basics.precision.fused import scaling
#   
#           register = scaling.SiteScaling._register_row_buffers
#   
#           def register_static(self, role, *args, **kwargs):
#               register(self, role, *args, **kwargs)
#               for name in (f"amax_{role}", f"saturated_{role}"):
#                   torch._dynamo.mark_static_address(self._buffers[name])
#   
#           scaling.SiteScaling._register_row_buffers = register_static
#       records = [0]
#       original = cudagraph_trees.CUDAGraphNode._record
#   
#       def counted(self, *args, **kwargs):
#           records[0] += 1
#           if records[0] % 50 == 0:
#               print(f"PROBE {records[0]} cuda graph recordings so far", flush=True)
#           return original(self, *args, **kwargs)
#   
#       cudagraph_trees.CUDAGraphNode._record = counted
#       def report():
#           from torch._dynamo.utils import counters
#   
#           graphs = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
#           print(f"PROBE resident={os.environ.get('RESIDENT', '0')} cuda graph recordings: {records[0]} {graphs}", flush=True)
#   
#       atexit.register(report)
# ===== .ab/fsdpgraphs.sh (call 6)
#   # h200 one GPU: the package's CUDA graphs under FSDP2 (gathered weights kept, buffers static), no probe site.
#   # 1) GPU tests: the new FSDP2-under-CUDA-graphs test (1 GPU) and test_train_cli's GPU tests (the Trainer's order changed);
#   # 2) lab.host_time on one rank, 1.3b batch 4 FP8 (auto's fused path, delayed scaling): reduce-overhead against auto.
#   nvidia-smi -L; mkdir -p $OUT/g
#   timeout -k 5 ${TEST_S:-230} python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_distributed.py -k fsdp2_under_cuda_graphs tests/test_train_cli.py > $OUT/g/gpu-tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/g/gpu-tests.log
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   timeout -k 5 ${HT_S:-300} python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile reduce-overhead,auto --precisions fp8 --steps 10 --json $OUT/g/host-time.json > $OUT/g/host-time.log 2>&1; echo "host_time rc $?"
#   grep -v "^\[rank0\]:W" $OUT/g/host-time.log | grep "tok/s"
