# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0 carried as a wheel), torch 2.11.0+cu130, triton 3.6.0. Two nvidia-h200 requests on one machine
# (1 x H200, 16 CPU cores), main at 7294185: `bash tier_a.sh`, then `bash tier_b.sh`; a third on another machine of
# the kind, on the tree of 106e147 (the package differs from 7294185 only in two lines' "n/a" formatting):
# `bash tier_c.sh`. logs.tar.xz holds the three logs. (The device's copy printed 7294185 as its last commit in all
# three: its git metadata lags the tree it is given.)
#
# tier_a.sh:
# h200: the GPU tests not run on main since the 2026-11-28 tier (19a333d): the stack, the FP8 store guard, the fused kernels and units, the model and optimizer
nvidia-smi -L; git log --oneline -1; mkdir -p $OUT/logs
timeout -k 5 ${T:-550} python3 -m pytest -m gpu -p no:cacheprovider -v --durations=15 tests/test_stack.py tests/test_fp8_store_guard.py tests/test_fp8.py tests/test_fused_cast.py tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_fused_fp8.py tests/test_fused_head.py tests/test_model.py tests/test_optim.py tests/test_attention.py tests/test_data.py > $OUT/logs/tier-a.log 2>&1; echo "tier-a rc $?"
grep -E "passed|failed|error" $OUT/logs/tier-a.log | tail -3
#
# tier_b.sh:
# h200: the rest of the one-GPU tier not run on main since 2026-11-28: the main job's CLI, LoRA, the Amdahl analysis, Accelerate's path, the sweep
nvidia-smi -L; git log --oneline -1; mkdir -p $OUT/logs
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
timeout -k 5 ${T:-470} python3 -m pytest -m gpu -p no:cacheprovider -v --durations=15 tests/test_train_cli.py tests/test_lora.py tests/test_amdahl.py tests/test_accelerate_path.py tests/test_sweep.py > $OUT/logs/tier-b.log 2>&1; echo "tier-b rc $?"
grep -E "PASSED|FAILED|ERROR" $OUT/logs/tier-b.log | tail -20; tail -3 $OUT/logs/tier-b.log
#
# tier_c.sh:
# h200: the one-GPU tests left: the hf doctor's two cases (last at 8b51ecb), the host-time and memory-peak probes
nvidia-smi -L; git log --oneline -1; mkdir -p $OUT/logs
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
timeout -k 5 ${T:-320} python3 -m pytest -m gpu -p no:cacheprovider -v --durations=8 tests/test_hf_doctor.py tests/test_host_time.py tests/test_memory_peak.py > $OUT/logs/tier-c.log 2>&1; echo "tier-c rc $?"
grep -E "PASSED|FAILED|ERROR" $OUT/logs/tier-c.log | tail -8; tail -2 $OUT/logs/tier-c.log
