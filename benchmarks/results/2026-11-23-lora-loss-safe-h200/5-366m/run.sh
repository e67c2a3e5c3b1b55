python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
mkdir -p $OUT/w
# 366m with the settings of ../../2026-11-23-lora-1.3b-h200/'s rank and target tables (default compile, so that the
# profile splits the step): GRID names the ranks, targets and batch sizes of this call.
S="--presets 366m --fp8_lm_head on --fp8_path fused --fp8_fast_accum_backward --train_data scratch/tok/train.npy --val_data scratch/tok/val.npy"
timeout 570 python3 optimize_performance.py $S $GRID --timeout_s 280 --out_dir $OUT/w/$NAME 2>&1 | grep -v "Warning\|warn" > $OUT/w/$NAME.log
tail -6 $OUT/w/$NAME.log; cd $OUT && tar czf w.tgz w
