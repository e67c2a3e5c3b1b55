# The device commands behind this study, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

# Command 1, asked for nvidia-h100-x2, ran on 2 x H200, commit 5f6cfb9 (verify-h200.json; the --json name said h100):
timeout 250 python3 verify_fp8_compilation.py --json $OUT/verify-h100.json > $OUT/verify-h100.log 2>&1
timeout 310 python3 -m pytest -v -m gpu -p no:cacheprovider tests > $OUT/gpu-tests-h100x2.log 2>&1   # gpu-tests-h200x2-5f6cfb9.log

# Command 2, nvidia-h100-x1 (H100 A), commit 7ad7f8f:
timeout 200 python3 verify_fp8_compilation.py --json $OUT/verify-h100.json > $OUT/verify-h100.log 2>&1
timeout 360 python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_amdahl.py tests/test_verify_fp8.py tests/test_train_cli.py tests/test_lora.py tests/test_fused_fp8.py tests/test_sweep.py tests/test_host_time.py tests/test_memory_peak.py tests/test_hf_doctor.py tests/test_fused_head.py tests/test_fused_cast.py tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_model.py tests/test_optim.py > $OUT/gpu-tests-h100.log 2>&1   # gpu-tests-h100-7ad7f8f.log

# Command 3, nvidia-h100-x1 (H100 B), commit 7ad7f8f:
R="--dim 896 --n_heads 14 --intermediate_size 3584 --batch_size 16 --gradient_accumulation_steps 8 --compile_model --use_flash_attn --no_gradient_checkpointing --max_steps 40"
for p in use_fp8 no_use_fp8; do timeout 150 python3 train_h100.py $R --$p --out_dir /tmp/ref-$p > $OUT/ref-$p.log 2>&1; cp /tmp/ref-$p/result.json $OUT/ref-$p.result.json; done   # reference-command-h100.json
timeout 120 python3 -m pytest -x -q -m gpu -p no:cacheprovider tests/test_sweep.py > $OUT/gpu-sweep-test-h100.log 2>&1
timeout 170 python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_host_time.py tests/test_memory_peak.py tests/test_hf_doctor.py tests/test_fused_head.py tests/test_fused_cast.py tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_model.py tests/test_optim.py > $OUT/gpu-tests-rest-h100.log 2>&1

# Command 4, nvidia-h100-x1 (H100 B, the same machine still held), commit 7ad7f8f:
S="--precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2"
timeout 190 python3 optimize_performance.py --presets gpt2-small $S --compile auto --gradient_accumulation_steps 4 --out_dir $OUT/accum-gpt2-small > $OUT/accum-gpt2-small.log 2>&1   # accumulation-4-gpt2-small-h100.json
timeout 75 python3 -m pytest -v -m gpu -p no:cacheprovider tests/test_model.py tests/test_optim.py tests/test_fused_swiglu.py > $OUT/gpu-tests-last-h100.log 2>&1
