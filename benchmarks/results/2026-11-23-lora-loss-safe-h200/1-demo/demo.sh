# The LoRA loss check of the setting without fast backward accumulation: pretrain as in
# ../2026-11-23-lora-delayed-h200/4-demo-fast-accum/demo.sh, then fine-tune on scratch/tinyshakespeare.txt from the same
# base, seed and batches: BF16 base, FP8 base with delayed scaling under CUDA graphs (the fastest loss-keeping
# candidate). Then fa_grads.py on the same base: adapter-gradient error per fast-accumulation setting.
set -e
O=${OUT:-/tmp}/w/demo
python3 train_h100.py --preset 366m --n_layers 8 --batch_size 8 --max_steps 600 --eval_every 200 --out_dir $O/base
FT="--init_from $O/base --train_data scratch/tinyshakespeare.txt --batch_size 4 --max_steps 150 --warmup_steps 15"
FT="$FT --log_every 10 --eval_every 50 --eval_batches 16 --results_json $O/demo.json --lr 1e-3 --lora_rank 16 --lora_targets attn"
FP8="--use_fp8 --no_fp8_shape_filter --fp8_lm_head --fp8_path fused"
python3 train_h100.py $FT --no_use_fp8 --out_dir $O/lora-bf16-base
python3 train_h100.py $FT $FP8 --fp8_scaling delayed --compile_mode reduce-overhead --out_dir $O/lora-fp8-delayed-graphs
python3 $(dirname $0)/fa_grads.py --init_from $O/base --train_data scratch/tinyshakespeare.txt --lora_rank 16 --lora_targets attn
