python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
mkdir -p $OUT/w
S="--presets 1.3b --lora_ranks 16 --lora_targets attn --fp8_lm_head on --fp8_path fused --fp8_scaling delayed --fp8_fast_accum_backward --train_data scratch/tok/train.npy --val_data scratch/tok/val.npy"
timeout 560 python3 optimize_performance.py $S --batch_sizes 8 --compile reduce-overhead --timeout_s 550 --out_dir $OUT/w/fast-accum-delayed-graphs-bs8 2>&1 | grep -v "Warning\|warn" > $OUT/w/fast-accum-delayed-graphs-bs8.log
tail -5 $OUT/w/fast-accum-delayed-graphs-bs8.log; cat $OUT/w/fast-accum-delayed-graphs-bs8/lora.md
cd $OUT && tar czf w.tgz w
