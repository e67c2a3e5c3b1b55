# The device commands behind this folder, in the order they ran, verbatim but for the common prefix every one started
# with (torchao installed as in shared/GUIDE.md), run from the checkout root. Items 3-7 wrote under $OUT/r and ended
# with: cd $OUT && tar czf r.tgz --exclude='*.pt' r && rm -rf r (one file back); items 1-2 wrote under $OUT.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit

# 1. H100, main at 24725da plus the branch next/optimizer-fp8-copies's kernel, test and probe (eea475d), untracked in
#    the checkout: h100/optimizer-cast
(python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py tests/test_fused_rope.py tests/test_fused_head.py tests/test_memory_peak.py tests/test_adamw_cast.py 2>&1 | tail -25) > $OUT/gpu-tests.log
python3 next/optimizer_cast_bench.py 366m 1.3b > $OUT/optimizer-cast.json 2> $OUT/optimizer-cast.log

# 2. H100, 24725da (next/count-revert.patch, kept as h100/head-count/count-revert.patch: the count from the targets, as
#    e490263): h100/head-count, h100/lora-output-code
T=tests/test_lora.py::test_gpu_compiled_fp8_head_never_holds_its_whole_logits_beside_their_fp8_gradient
python3 -m pytest -m gpu -p no:cacheprovider -q -x --tb=short -p no:logging $T > $OUT/head-test-mend.log 2>&1
git apply next/count-revert.patch && python3 -m pytest -m gpu -p no:cacheprovider -q -x --tb=short -p no:logging $T > $OUT/head-test-revert.log 2>&1
git checkout cs336_basics/precision/fused/head.py
# (the output code below ran on 24725da's package after the checkout above: the head's count does not touch it)
TORCH_LOGS=output_code python3 -m cs336_basics.benchmark.lora_analysis --preset 1.3b --n_layers 3 --lora_rank 16 --lora_targets attn --random_base --top_kernels 40 --out_dir $OUT/lc > $OUT/lc.log 2> $OUT/lc-code.log; gzip $OUT/lc-code.log

# 3/4. H100, 98ccef2; the "old" package is a copy of it with lora/layers.py, compiled.py and parallel/wrap.py from
#      e490263 (carried as next/old/): h100/lora-ab
mkdir /tmp/old && cp -r cs336_basics optimize_performance.py train_h100.py /tmp/old/ && cp -r next/old/cs336_basics /tmp/old/ || exit; diff -rq cs336_basics /tmp/old/cs336_basics
timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py tests/test_fused_rope.py > $OUT/r/gpu-tests.log 2>&1
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 220 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-old > $OUT/r/lora-old.log 2>&1)
timeout 220 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-new > $OUT/r/lora-new.log 2>&1

# 6. H100, 98ccef2, the same machine: h100/cold-366m, then h100/cold-1.3b (two commands)
timeout 560 python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/r/cold-366m > $OUT/r/cold-366m.log 2>&1
timeout 560 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 150 --out_dir $OUT/r/cold-1.3b > $OUT/r/cold-1.3b.log 2>&1

# 5. H200, 98ccef2: h200/gpu-tests-lora
timeout 250 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_fp8.py tests/test_fp8.py tests/test_fused_swiglu.py tests/test_fused_head.py tests/test_memory_peak.py > $OUT/r/gpu-tests.log 2>&1
timeout 220 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-1.3b > $OUT/r/lora-1.3b.log 2>&1

# 7. H200, 98ccef2, the same machine: h200/cold-366m-gpt2-small, then h200/cold-1.3b
S=$(date +%s); for p in 366m gpt2-small; do left=$(( 585 - ($(date +%s) - S) )); timeout $left python3 optimize_performance.py --presets $p --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/r/cold-$p > $OUT/r/cold-$p.log 2>&1; done
timeout 560 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 150 --out_dir $OUT/r/cold-1.3b > $OUT/r/cold-1.3b.log 2>&1

# 6'. H100, 98ccef2, another machine: h100/cold-gpt2-small
timeout 560 python3 optimize_performance.py --presets gpt2-small --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/r/cold-gpt2-small > $OUT/r/cold-gpt2-small.log 2>&1

# 8. H100, 0aff83b: h100/gpu-tests-cli
timeout 330 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_train_cli.py tests/test_verify_fp8.py > $OUT/gpu-tests-cli.log 2>&1
