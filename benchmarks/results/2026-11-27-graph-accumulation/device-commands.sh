# The device commands behind this study, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S="--presets 366m --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2"

# Command A, nvidia-h100-x1 (H100 A), commit 0c4d2c9:
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_stack.py tests/test_fp8_store_guard.py tests/test_accumulation.py   # h100-gpu-tests-0c4d2c9.log
timeout 330 python3 optimize_performance.py $S --compile auto --gradient_accumulation_steps 4 --out_dir $OUT/accum   # accumulation-4-h100.json

# Command B, nvidia-h200, commit 1311937:
timeout 190 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_stack.py tests/test_fp8_store_guard.py tests/test_accumulation.py tests/test_fused_rope.py   # h200-gpu-tests-1311937.log
timeout 195 python3 optimize_performance.py $S --compile auto --gradient_accumulation_steps 4 --out_dir $OUT/accum   # accumulation-4-h200.json

# Command C, nvidia-h100-x1 (H100 B), commit 1311937:
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_stack.py tests/test_fp8_store_guard.py   # h100-gpu-tests-1311937.log
