# The device commands behind this folder, in the order they ran, verbatim but for the common prefix every one started
# with (torchao installed as in shared/GUIDE.md), run from the checkout root. Items 2-6 wrote under $OUT/r and ended
# with: cd $OUT && tar czf r.tgz --exclude='*.pt' r && rm -rf r (one file back); item 1 wrote under $OUT.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit

# 1. H200, branch next/lora-fused-rope at fafd38e (the code of 4fd1610, before its test mend): h200/ab
python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_rope.py tests/test_lora.py tests/test_lora_analysis.py > $OUT/gpu-tests.log 2>&1
for rope in no_fp8_fused_rope fp8_fused_rope; do python3 -m cs336_basics.benchmark.lora_analysis --preset 1.3b --lora_rank 16 --lora_targets attn --random_base --top_kernels 45 --$rope --json $OUT/lora-$rope.json > $OUT/lora-$rope.log 2>&1; done

# 2. H200, 4fd1610 (+ lora_memory.py, then untracked at next/): h200/defaults
timeout 100 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_rope.py -k frozen > $OUT/r/gpu-test-frozen.log 2>&1
timeout 260 python3 next/lora_memory.py > $OUT/r/lora-memory.log 2>&1
timeout 200 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-defaults > $OUT/r/lora-defaults.log 2>&1

# 3. H200, 4fd1610, the same machine right after item 2: h200/lora-parity
timeout 150 python3 train_h100.py --preset 366m --max_steps 300 --eval_every 0 --out_dir /tmp/base > $OUT/r/base.log 2>&1
timeout 400 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --init_from /tmp/base --lora_rank 16 --lora_targets attn --max_steps 200 --eval_every 50 --eval_batches 16 --out_dir $OUT/r/lora-parity > $OUT/r/lora-parity.log 2>&1

# 4. H200, aea1d57 (the head by blocks of rows): h200/head-blocks
timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py tests/test_fused_head.py > $OUT/r/gpu-tests.log 2>&1
timeout 220 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-defaults > $OUT/r/lora-defaults.log 2>&1

# 5. H100, aea1d57: h100/lora-defaults
for p in 1.3b 366m; do timeout 230 python3 optimize_performance.py --presets $p --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-$p > $OUT/r/lora-$p.log 2>&1; done

# 6. H100, aea1d57: h100/gpu-tests, h100/lora-top-kernels
timeout 260 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_rope.py tests/test_lora.py tests/test_fused_head.py tests/test_lora_analysis.py > $OUT/r/gpu-tests.log 2>&1
timeout 200 python3 -m cs336_basics.benchmark.lora_analysis --preset 1.3b --lora_rank 16 --lora_targets attn --random_base --top_kernels 45 --json $OUT/r/lora-top.json > $OUT/r/lora-top.log 2>&1
