# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130, triton 3.6.0. Three nvidia-h200-x4 requests, one
# machine (4 x H200, 64 CPU cores), each fired as the one before returned; main at 19a333d in all three.
#
# Part 1 (logs.tar.xz: part-1-gpu-tier.log): the whole GPU tier, stopped by its 560 s limit in the 11th test of
# test_distributed.py (the fused 4 -> 2 -> 1 chain); -rA prints its summary only at the end, so the log has dots.
timeout 560 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=25 tests > $OUT/gpu-tier.log 2>&1
#
# Part 2 (part-2.log): from that test on, the files after test_distributed.py but the programs' ones. Its 540 s
# SIGTERM reached pytest inside a training run, whose stop handler finishes the step it is in (a compile), so the
# device's 600 s limit ended the command; part 3 adds `-k 5` (SIGKILL 5 s after the SIGTERM).
timeout 540 python3 -m pytest -m gpu -p no:cacheprovider -v --durations=25 \
  "tests/test_distributed.py::test_gpu_checkpoints_move_between_four_two_and_one_gpus[fused]" \
  $(ls tests/test_*.py | grep -vE "test_(accelerate_path|accumulation|amdahl|attention|data|distributed)\.py") \
  > $OUT/gpu-tier2.log 2>&1
#
# Part 3 (part-3.log): the files part 2 did not reach, test_hf_doctor.py last; stopped by its 480 s limit in the
# second test of test_verify_fp8.py.
timeout -k 5 480 python3 -m pytest -m gpu -p no:cacheprovider -v --durations=25 tests/test_host_time.py \
  tests/test_lora.py tests/test_memory_peak.py tests/test_model.py tests/test_optim.py tests/test_stack.py \
  tests/test_sweep.py tests/test_train_cli.py tests/test_verify_fp8.py tests/test_hf_doctor.py > $OUT/gpu-tier3.log 2>&1
