# After the head's backward GEMMs stopped taking --fp8_fast_accum_backward: the demo base of ../1-demo/demo.sh again,
# fine-tuned with the BF16 base and with the FP8 base, delayed scaling, CUDA graphs and fast backward accumulation
# (in every FP8 GEMM but the head's backward ones); then grads.py on that base, for full fine-tuning (the pre-training
# path's GEMMs) and for LoRA.
set -e
O=${OUT:-/tmp}/w/demo
python3 train_h100.py --preset 366m --n_layers 8 --batch_size 8 --max_steps 600 --eval_every 200 --out_dir $O/base
FT="--init_from $O/base --train_data scratch/tinyshakespeare.txt --batch_size 4 --max_steps 150 --warmup_steps 15"
FT="$FT --log_every 10 --eval_every 50 --eval_batches 16 --results_json $O/demo.json --lr 1e-3 --lora_rank 16 --lora_targets attn"
FP8="--use_fp8 --no_fp8_shape_filter --fp8_lm_head --fp8_path fused --fp8_fast_accum_backward"
python3 train_h100.py $FT --no_use_fp8 --out_dir $O/lora-bf16-base
python3 train_h100.py $FT $FP8 --fp8_scaling delayed --compile_mode reduce-overhead --out_dir $O/lora-fp8-delayed-graphs-fast-accum
python3 $(dirname $0)/grads.py --init_from $O/base --train_data scratch/tinyshakespeare.txt
python3 $(dirname $0)/grads.py --init_from $O/base --train_data scratch/tinyshakespeare.txt --lora_rank 16 --lora_targets attn
