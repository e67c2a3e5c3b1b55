python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
mkdir -p $OUT/w
timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_lora.py tests/test_verify_fp8.py tests/test_lora_analysis.py tests/test_fused_fp8.py tests/test_fused_swiglu.py tests/test_fused_head.py > $OUT/w/gpu-tests.log 2>&1; tail -3 $OUT/w/gpu-tests.log
S="--presets 1.3b --lora_ranks 16 --lora_targets attn --fp8_lm_head on --fp8_path fused --fp8_scaling delayed --train_data scratch/tok/train.npy --val_data scratch/tok/val.npy"
timeout 330 python3 optimize_performance.py $S --batch_sizes 8 --compile reduce-overhead --timeout_s 320 --out_dir $OUT/w/delayed-graphs-bs8 2>&1 | grep -v "Warning\|warn" > $OUT/w/delayed-graphs-bs8.log
tail -3 $OUT/w/delayed-graphs-bs8.log; cd $OUT && tar czf w.tgz w
