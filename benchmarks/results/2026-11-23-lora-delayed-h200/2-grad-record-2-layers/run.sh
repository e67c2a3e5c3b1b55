python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
mkdir -p $OUT/w
L="--preset 1.3b --n_layers 2 --batch_size 4 --lora_rank 16 --lora_targets attn --fp8_lm_head --fp8_path fused --fp8_fast_accum_backward --train_data scratch/tok/train.npy --val_data scratch/tok/val.npy --random_base --fp8_scaling delayed"
TORCH_LOGS=output_code TAG=rows ROWMODE=rows timeout 150 python3 scratch/diag.py $L > $OUT/w/code-rows.log 2>&1; grep "^==" -A8 $OUT/w/code-rows.log
for m in cols chunks; do TAG=$m ROWMODE=$m timeout 150 python3 scratch/diag.py $L 2>&1 | grep "^==" -A8; done
TAG=dyn timeout 150 python3 scratch/diag.py ${L/delayed/dynamic} 2>&1 | grep "^==" -A8
python3 - <<'P'
import json,os
for t in ("rows-delayed","cols-delayed","chunks-delayed","dyn-dynamic"):
    r=json.load(open(os.environ["OUT"]+f"/w/diag/{t}.json"))
    print(t, [ (k[:90],n,round(ms,3)) for k,n,ms in r["top"] if "triton" in k][:6])
P
cd $OUT && tar czf w.tgz w
