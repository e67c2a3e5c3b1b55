# The device commands behind this study, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl). Logs: logs.tar.xz.

# Command A, nvidia-h100-x1 (one H100, 16 CPU cores), commit 7e6d1a7 (before --compile_wrapper existed): the same
# probe twice, in two processes, the second with inductor's C++ wrapper switched on process-wide by its environment
# variable (the settings --compile_wrapper cpp later gives as compile options).
H="python3 -m lab.host_time --presets 366m --precisions bf16,fp8 --compile default --top_ops 25"
$H --json $OUT/host-python-h100.json > $OUT/python.log 2>&1                           # host-time-python-wrapper-h100.json
TORCHINDUCTOR_CPP_WRAPPER=1 $H --json $OUT/host-cpp-h100.json > $OUT/cpp.log 2>&1     # host-time-cpp-wrapper-env-h100.json

# Command B, nvidia-h100-x4 (ran on 4 x H200), commit 83da342: the GPU tests in four shards at once, one per GPU
# (test_distributed.py on two), on the tree with --compile_wrapper passing only {"cpp_wrapper": True}.
P="timeout 545 python3 -m pytest -v -m gpu -p no:cacheprovider --durations=12"
CUDA_VISIBLE_DEVICES=0 $P tests/test_fp8_store_guard.py tests/test_stack.py                  # ...-a-guard.log
CUDA_VISIBLE_DEVICES=1 $P tests/test_fused_cast.py tests/test_fused_swiglu.py tests/test_fused_rope.py \
  tests/test_fused_fp8.py tests/test_fused_head.py tests/test_fp8.py tests/test_model.py tests/test_attention.py \
  tests/test_optim.py tests/test_data.py tests/test_accumulation.py tests/test_accelerate_path.py \
  tests/test_hf_doctor.py tests/test_memory_peak.py tests/test_host_time.py                  # ...-b-kernels.log
CUDA_VISIBLE_DEVICES=2,3 $P tests/test_distributed.py                                        # ...-c-dist.log
CUDA_VISIBLE_DEVICES=3 $P tests/test_verify_fp8.py tests/test_train_cli.py tests/test_lora.py tests/test_amdahl.py \
  tests/test_sweep.py                                                                        # ...-d-programs.log

# Command C, nvidia-h100-x4 (ran on 4 x H200, another host), commit 1ac7a6e: the failed tests again (shards at
# once; -k in shard b applied to every file named, so only test_fused_fp8's two compiled runs ran there), then,
# alone on the host, the probe with auto's choice (the C++ wrapper, as compile options).
P="timeout 390 python3 -m pytest -v -m gpu -p no:cacheprovider --durations=8"
CUDA_VISIBLE_DEVICES=0 $P tests/test_fused_fp8.py -k "compiled_fused_run" tests/test_accumulation.py \
  tests/test_accelerate_path.py tests/test_hf_doctor.py tests/test_memory_peak.py tests/test_host_time.py   # ...-b.log
CUDA_VISIBLE_DEVICES=1 $P tests/test_verify_fp8.py tests/test_amdahl.py                     # ...-d1.log
CUDA_VISIBLE_DEVICES=2,3 $P tests/test_distributed.py                                        # ...-c.log
CUDA_VISIBLE_DEVICES=3 $P tests/test_train_cli.py tests/test_sweep.py                        # ...-d2.log
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 -m lab.host_time --presets 366m --precisions bf16,fp8 --compile default \
  --json $OUT/host-cpp-product.json > $OUT/host.log 2>&1                                   # host-time-cpp-wrapper-h200.json
