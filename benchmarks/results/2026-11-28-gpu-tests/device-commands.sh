# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl).

# Command 1, nvidia-h100-x2 (ran on 2 x H200), main at ae7be1b; .ab/rope: a copy of the rope branch (carried), which
# lacked the top-level scripts. Three shards at once.
P="python3 -m pytest -v -m gpu -p no:cacheprovider --durations=10"
CUDA_VISIBLE_DEVICES=0 timeout 560 $P tests/test_accumulation.py tests/test_accelerate_path.py tests/test_hf_doctor.py \
  tests/test_memory_peak.py tests/test_host_time.py tests/test_amdahl.py tests/test_verify_fp8.py   # ...-one-gpu-tests.log
(cd .ab/rope && CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site:$PWD timeout 560 $P tests/test_fused_rope.py \
  tests/test_fp8_store_guard.py tests/test_lora.py)                                               # ...-collection-error.log
CUDA_VISIBLE_DEVICES=0,1 timeout 560 $P tests/test_distributed.py                                 # ...-distributed-tests.log

# Command 2, nvidia-h100-x1 (one H100), .ab/rope: the whole tree of wip/rope-one-launch at 6fd781e (main merged in).
(cd .ab/rope && PYTHONPATH=/tmp/site:$PWD timeout 250 python3 -m pytest -v -m gpu -p no:cacheprovider --durations=8 \
  tests/test_fused_rope.py tests/test_fp8_store_guard.py tests/test_lora.py)                       # h100-rope-6fd781e-tests.log
