# The README's fine-tuning demo and the LoRA loss check, as run on one H200 (2026-11-23):
# pretrain on the default corpus (the Python standard library's source), then fine-tune on another text file
# (scratch/tinyshakespeare.txt, a copy of ../shared/data/tinyshakespeare.txt, not committed) three ways from the same
# base, seed and data order: LoRA on a BF16 base, LoRA on an FP8 base, and every weight (full fine-tuning).
set -e
O=${OUT:-/tmp}/demo
python3 train_h100.py --preset 366m --n_layers 8 --batch_size 8 --max_steps 600 --eval_every 200 --out_dir $O/base
FT="--init_from $O/base --train_data scratch/tinyshakespeare.txt --batch_size 4 --max_steps 150 --warmup_steps 15"
FT="$FT --log_every 10 --eval_every 50 --eval_batches 16 --results_json $O/demo.json"
python3 train_h100.py $FT --lr 1e-3 --lora_rank 16 --lora_targets attn --no_use_fp8 --out_dir $O/lora-bf16-base
python3 train_h100.py $FT --lr 1e-3 --lora_rank 16 --lora_targets attn --use_fp8 --no_fp8_shape_filter --fp8_lm_head \
  --out_dir $O/lora-fp8-base
python3 train_h100.py $FT --lr 1e-4 --no_use_fp8 --out_dir $O/full-bf16
