# The device commands behind this folder, in the order they ran, verbatim but for the common prefix every one started
# with (torchao installed as in shared/GUIDE.md), run from the checkout root; each wrote under $OUT/r, copied here.
# Every command also ended with: cd $OUT && tar czf r.tgz r && rm -rf r (one file back).
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit

# 1. H200, b631c08 (+ the tile script, then untracked at next/): h200/weight-cast-tiles, h200/lora-1.3b-compile-default
timeout 150 python3 next/weight_cast_tiles.py $OUT/r/weight-cast-tiles.json 2>&1 | tee $OUT/r/weight-cast-tiles.log
timeout 400 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora > $OUT/r/lora.log 2>&1

# 2. H200, 33da27b (the sweep's LoRA mode and --quick now compile auto): h200/cold-366m, h200/lora-1.3b-crash
timeout 430 python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/r/cold-366m > $OUT/r/cold-366m.log 2>&1
timeout 150 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora > $OUT/r/lora.log 2>&1

# 3. H200, a57d642 (the kernel-name split's condition fixed): h200/lora-1.3b, h200/cold-1.3b
timeout 170 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora > $OUT/r/lora.log 2>&1
timeout 415 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 150 --out_dir $OUT/r/cold-1.3b > $OUT/r/cold-1.3b.log 2>&1

# 4. H200, 38fdd34 (--top_kernels): h200/lora-1.3b-top-kernels, h200/parity-366m (the command ran past 600 s while
#    packing the runs' checkpoints; parity.json, parity.png and the logs came back, the per-variant folders did not)
timeout 180 python3 -m cs336_basics.benchmark.lora_analysis --preset 1.3b --lora_rank 16 --lora_targets attn --random_base --top_kernels 45 --json $OUT/r/lora-top.json > $OUT/r/lora-top.log 2>&1
timeout 380 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --compile_mode auto --max_steps 400 --eval_every 100 --eval_batches 16 --out_dir $OUT/r/parity > $OUT/r/parity.log 2>&1

# 5. H100, 38fdd34: h100/cold-1.3b, h100/gpu-tests/optim-lora-analysis-sweep.log
timeout 425 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 150 --out_dir $OUT/r/cold-1.3b > $OUT/r/cold-1.3b.log 2>&1
timeout 150 python3 -m pytest -q -m gpu tests/test_optim.py tests/test_lora_analysis.py tests/test_sweep.py -p no:cacheprovider > $OUT/r/gpu-tests.log 2>&1

# 6. H100, 38fdd34: h100/gpu-tests/gpu-tests-a.log
timeout 560 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_cast.py tests/test_fused_fp8.py tests/test_fused_head.py tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_lora.py tests/test_fp8.py tests/test_accelerate_path.py tests/test_attention.py tests/test_data.py tests/test_optim.py tests/test_hf_doctor.py tests/test_model.py tests/test_host_time.py tests/test_memory_peak.py > $OUT/r/gpu-tests-a.log 2>&1

# 7. H100, 38fdd34: h100/gpu-tests/gpu-tests-b.log
timeout 400 python3 -m pytest -m gpu -p no:cacheprovider -v tests/test_train_cli.py tests/test_verify_fp8.py tests/test_amdahl.py tests/test_sweep.py tests/test_distributed.py tests/test_lora_analysis.py > $OUT/r/gpu-tests-b.log 2>&1

# 8. H100, 38fdd34: h100/cold-366m
timeout 435 python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/r/cold-366m > $OUT/r/cold-366m.log 2>&1
