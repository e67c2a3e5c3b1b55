# usage: bash scratch/lora_levers.sh PRESET RANK TARGETS BATCH variant...   (variants: bf16 fp8 fp8head perlayer fastacc)
preset=$1; rank=$2; targets=$3; bs=$4; shift 4
T="--train_data scratch/tok/train.npy --val_data scratch/tok/val.npy"
[ -f /tmp/base-$preset.pt ] || python3 scratch/make_base.py $preset /tmp/base-$preset.pt
mkdir -p $OUT/logs
for v in "$@"; do
  case $v in
    bf16) f="--no_use_fp8";;
    fp8) f="--use_fp8";;
    fp8head) f="--use_fp8 --fp8_lm_head";;
    perlayer) f="--use_fp8 --fp8_lm_head --fp8_path fused --no_fp8_share_input_casts --no_fp8_fused_swiglu";;
    fastacc) f="--use_fp8 --fp8_lm_head --fp8_path fused --fp8_fast_accum_backward";;
  esac
  name=$preset-r$rank-$targets-bs$bs-$v
  timeout -s KILL 290 python3 train_h100.py --preset $preset --init_from /tmp/base-$preset.pt --lora_rank $rank \
    --lora_targets $targets --batch_size $bs $f --max_steps 30 --log_every 10 --eval_every 0 --checkpoint_every 0 $T \
    --out_dir /tmp/run-$name --results_json $OUT/levers.json > $OUT/logs/$name.log 2>&1
  echo "$name rc=$? $(grep -m1 'LoRA base' $OUT/logs/$name.log)"
done
python3 -c "
import json; d=json.load(open('$OUT/levers.json'))
for r in d['runs']: print(r['preset'], r['lora_rank'], r['lora_targets'], r['batch_size'], r['precision'], r['fp8_lm_head'], round(r.get('tokens_per_sec') or 0), r.get('compile_s'), r.get('peak_mem_gib'), r.get('loss'))
"
