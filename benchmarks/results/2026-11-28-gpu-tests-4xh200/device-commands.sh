# The device command behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl). nvidia-h100-x4, which ran on 4 x H200 (64 CPU cores); main at 3150415.
# Two shards at once: the fused path's GPU tests on GPU 0, the distributed ones on all four GPUs.
P="python3 -m pytest -v -m gpu -p no:cacheprovider --durations=12"
(CUDA_VISIBLE_DEVICES=0 timeout 400 $P tests/test_fused_fp8.py > $OUT/one-gpu-fused-fp8-tests.log 2>&1) &   # logs/4xh200-3150415-fused-fp8-tests.log
timeout 540 $P tests/test_distributed.py > $OUT/distributed-tests.log 2>&1                                 # logs/4xh200-3150415-distributed-tests.log
wait
