# The device commands behind this folder, in the order they ran, verbatim but for the common prefix every one started
# with (torchao installed as in shared/GUIDE.md), run from the checkout root, and the final `tar` of $OUT (checkpoints
# and tokenizer files left out). The tree was main at 73d7d93's package (the branch next/pretrain-joint-dgrad at
# f1717cd; its test fixes, 73d7d93, were in the tree from command 2 on, test_verify_fp8.py's from command 4), with an
# untracked copy of the main before it beside it:
#   next/old/ = `git archive bbe3112 cs336_basics optimize_performance.py train_h100.py`
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONUNBUFFERED=1 || exit
# Machines: commands 1-3 one H100 ("H100 A"), 4 an H200, 5-7 another H100 ("H100 B"), each started for its first
# command and kept warm after it.

# 1. nvidia-h100-x1: h100-cmd1 (one warm run per side; old1's sweep files did not come back, over the file count)
mkdir -p /tmp/old && cp -r next/old/. /tmp/old/; S="--presets 366m --precisions fp8 --compile auto --attention sdpa --ac off --steps 20 --timeout_s 150"
PYTHONPATH=/tmp/site:$PWD python3 optimize_performance.py $S --out_dir $OUT/new1 > $OUT/new1.log 2>&1
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old python3 optimize_performance.py $S --out_dir $OUT/old1 > $OUT/old1.log 2>&1)
PYTHONPATH=/tmp/site:$PWD timeout 330 python3 -m pytest -m gpu -p no:cacheprovider -q -x tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_fused_fp8.py tests/test_lora.py tests/test_verify_fp8.py > $OUT/tests.log 2>&1

# 2. nvidia-h100-x1 (H100 A): h100-cmd2 (the old side was cut by its 200 s limit in its third run: 2 of 3 runs)
mkdir -p /tmp/old && cp -r next/old/. /tmp/old/; S="--presets 366m --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110"
PYTHONPATH=/tmp/site:$PWD timeout 330 python3 optimize_performance.py $S --precisions bf16,fp8 --out_dir $OUT/new > $OUT/new.log 2>&1
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 200 python3 optimize_performance.py $S --precisions fp8 --out_dir $OUT/old > $OUT/old.log 2>&1)

# 3. nvidia-h100-x1 (H100 A): h100-cmd3
export PYTHONPATH=/tmp/site:$PWD
timeout 280 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_fp8.py tests/test_lora.py tests/test_verify_fp8.py > $OUT/tests.log 2>&1
timeout 300 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --compile_mode auto --max_steps 400 --eval_every 100 --eval_batches 16 --out_dir $OUT/parity > $OUT/parity.log 2>&1

# 4. nvidia-h200: h200-cmd4
mkdir -p /tmp/old && cp -r next/old/. /tmp/old/
PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_verify_fp8.py::test_gpu_mode_sees_real_fp8_gemms "tests/test_fused_fp8.py::test_gpu_compiled_fused_run_launches_three_fp8_gemms_per_linear" > $OUT/tests.log 2>&1
S="--presets 366m --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110"
PYTHONPATH=/tmp/site:$PWD timeout 290 python3 optimize_performance.py $S --precisions bf16,fp8 --out_dir $OUT/new > $OUT/new.log 2>&1
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 200 python3 optimize_performance.py $S --precisions fp8 --out_dir $OUT/old > $OUT/old.log 2>&1)

# 5. nvidia-h100-x1 (H100 B): h100-cmd5
mkdir -p /tmp/old && cp -r next/old/. /tmp/old/; S="--presets 1.3b --lora_ranks 16 --lora_targets attn"
PYTHONPATH=/tmp/site:$PWD timeout 220 python3 optimize_performance.py $S --out_dir $OUT/new > $OUT/new.log 2>&1
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 220 python3 optimize_performance.py $S --out_dir $OUT/old > $OUT/old.log 2>&1)

# 6. nvidia-h100-x1 (H100 B): h100-cmd6
export PYTHONPATH=/tmp/site:$PWD
timeout 560 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 150 --out_dir $OUT/cold-1.3b > $OUT/cold-1.3b.log 2>&1

# 7. nvidia-h100-x1 (H100 B): h100-cmd7 (cut by the session's device time in FP8's third run: 2 of 3 FP8 runs)
export PYTHONPATH=/tmp/site:$PWD
timeout 250 python3 optimize_performance.py --presets gpt2-small --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 80 --out_dir $OUT/cold-gpt2-small > $OUT/cold-gpt2-small.log 2>&1
