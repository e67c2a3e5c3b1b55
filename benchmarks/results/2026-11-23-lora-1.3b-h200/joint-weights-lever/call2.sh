F="--preset 1.3b --batch_size 4 --lora_rank 16 --lora_targets attn --train_data scratch/tok/train.npy --val_data scratch/tok/val.npy"
FP8="--fp8_lm_head --fp8_path fused --fp8_fast_accum_backward"
timeout 300 python3 -m cs336_basics.benchmark.lora_analysis $F $FP8 --random_base --json $OUT/joint.json > $OUT/joint.log 2>&1
grep -E "idle|\| 1.3b" $OUT/joint.log | cut -c1-400
python3 scratch/make_base.py 1.3b /tmp/base.pt
T="--init_from /tmp/base.pt --no_use_fp8 --max_steps 30 --log_every 10 --eval_every 0 --checkpoint_every 0 --results_json $OUT/bf16.json"
timeout 150 python3 scratch/no_joins.py $F $T --out_dir /tmp/a > $OUT/bf16-separate.log 2>&1
timeout 150 python3 train_h100.py $F $T --out_dir /tmp/b > $OUT/bf16-joint.log 2>&1
python3 -c "
import json; d=json.load(open('$OUT/bf16.json'))
for r in d['runs']: print(r['precision'], round(r['tokens_per_sec']), r['peak_mem_gib'], r['compile_s'])
"
