python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
mkdir -p $OUT/w
L="--preset 1.3b --batch_size ${BS:-4} --lora_rank 16 --lora_targets attn --fp8_lm_head --fp8_path fused --fp8_fast_accum_backward --train_data scratch/tok/train.npy --val_data scratch/tok/val.npy --random_base"
for s in ${SCALINGS:-dynamic delayed}; do
  TAG=${TAG:-default} timeout ${T:-200} python3 scratch/diag.py $L --fp8_scaling $s $EXTRA 2>&1 | grep -v "Warning\|warn(" | tail -30 | tee -a $OUT/w/diag.log
done
cd $OUT && tar czf w.tgz w
