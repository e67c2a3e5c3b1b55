# The device commands behind this record, verbatim, in order. Four nvidia-h200 requests (1 x H200, 16 vCPUs, KVM
# guest): calls 1-2 on one machine (GPU-879ea497), call 3 on a second (GPU-773cbcc2), call 4 on a third (GPU-16a29f6b). torch 2.11.0+cu130, triton
# 3.6.0, torchao 0.18.0 (its wheel carried in .whl). carry: [".whl", ".ab"].
# Code: calls 1-2 ran the working tree at d5924fd (plus, in call 2, the GPU test parametrized over both FP8 paths);
# call 3 ran 7e62ae4's tree (the scale kept in place), call 4 70e81fe's (the same package). matrix.sh's `git log` line printed 62e2ba1 on the device, yet
# the tree it ran was this checkout's working tree (call 2 ran the test's parametrization, not committed then): that
# line came from a .git the tree did not match. d5924fd's package differs from 62e2ba1's only in how a rank leaves
# after an error.
# Every optimize_performance.py run started with empty compile caches (--cold).
#
# call 1 (mode matrix, one GPU: CUDA graphs and --compile default; the second FP8 run of nographs was cut by the
# script's 290 s limit, so that row has 1 of 2 runs):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; M="graphs nographs" bash .ab/matrix.sh
# call 2 (the FSDP2 CUDA-graph GPU test over both FP8 paths, before the scale fix; then the accumulation row):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT; timeout -k 5 200 python3 -m pytest -q -m gpu tests/test_distributed.py -k fsdp2_under_cuda_graphs -p no:cacheprovider > $OUT/gputest.log 2>&1; echo "gpu tests rc $?"; tail -5 $OUT/gputest.log; M=accum T=320 bash .ab/matrix.sh
# call 3 (the scale fix: the same GPU test; then FSDP2 on one rank under CUDA graphs, the host's Python by library):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT; nvidia-smi -L; timeout -k 5 220 python3 -m pytest -q -m gpu tests/test_distributed.py -k fsdp2_under_cuda_graphs -p no:cacheprovider > $OUT/gputest2.log 2>&1; echo "gpu tests rc $?"; grep -E "^E |passed|failed" $OUT/gputest2.log | tail -6; timeout -k 5 170 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile reduce-overhead --precisions fp8 --steps 10 --top_python 25 --json $OUT/fsdp-graphs-python.json > $OUT/fsdp-graphs-python.log 2>&1; echo "host_time rc $?"; grep -v "^\[rank0\]:W" $OUT/fsdp-graphs-python.log | tail -45
# call 4 (the no-graph row again, both FP8 runs this time, with a longer limit):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; M=nographs T=340 bash .ab/matrix.sh
#
# matrix-and-fsdp2.json gathers the sweeps' records and lab.host_time's row, each with mode, device_call, gpu_uuid
# and code added; logs.tar.xz has every log (call1/ to call4/).
#
# ===== .ab/matrix.sh
#   # The one-GPU mode matrix (GUIDE.md) on main's code, first runs: M picks the modes (graphs, nographs, accum).
#   nvidia-smi -L; git log --oneline -1 2>/dev/null
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   S="--precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2"
#   for m in ${M:-graphs nographs}; do
#     case $m in
#       graphs) A="--compile auto";;
#       nographs) A="--compile default";;
#       accum) A="--compile auto --gradient_accumulation_steps 4";;
#     esac
#     timeout -k 5 ${T:-290} python3 optimize_performance.py --presets 366m $S $A --out_dir $OUT/$m > $OUT/$m.log 2>&1
#     echo "$m rc $?"; tail -8 $OUT/$m.log
#   done
#   cd $OUT && tar cJf matrix-$(echo ${M:-graphs nographs} | tr ' ' '-').tar.xz */ *.log
