# The device commands behind this folder, in the order they ran, verbatim but for the common prefix each started with
# (torchao installed as in shared/GUIDE.md, PYTHONUNBUFFERED=1) and the final `tar` of $OUT. The tree was branch
# next/lora-levers (both levers; main since), with untracked copies of other code beside it:
#   next/old/     = `git archive f4fec49 cs336_basics optimize_performance.py train_h100.py` (main before the levers;
#                   for commands 5 and 8: the same of main at 5e8a5f3)
#   next/grouped/ = the same of branch next/lora-grouped-adapters (c6b87f4's tree)
#   next/joint/   = not a folder: commands 5 and 8 ran branch next/joint-dgrad as the tree
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONUNBUFFERED=1 || exit

# 1. (nvidia-h100-x1, a machine started for it) before / grouped / both
R=$PWD; for v in old grouped both; do if [ $v = both ]; then D=$R; else D=/tmp/$v; mkdir -p $D; cp -r next/$v/. $D/; fi; (cd $D && PYTHONPATH=/tmp/site:$D timeout 195 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/r/lora-$v > $OUT/r/lora-$v.log 2>&1); done

# 2. (the same H100) GPU tests, then the 366m base and the LoRA loss parity from the defaults
export PYTHONPATH=/tmp/site:$PWD
timeout 170 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py tests/test_lora_analysis.py tests/test_host_time.py > $OUT/p/gpu-tests.log 2>&1
timeout 150 python3 train_h100.py --preset 366m --max_steps 300 --out_dir /tmp/base366 > $OUT/p/base.log 2>&1
timeout 240 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --init_from /tmp/base366 --lora_rank 16 --lora_targets attn --max_steps 200 --eval_every 50 --eval_batches 16 --out_dir /tmp/parity > $OUT/p/parity.log 2>&1

# 3. (asked as nvidia-h200; ran on the same held H100) before / both, then the fixed GPU test (5e8a5f3's tests/test_lora.py)
for v in old both; do ...as in 1, timeout 190, --out_dir $OUT/h/lora-$v...; done
PYTHONPATH=/tmp/site:$R timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py -k "fine_tune_runs_compiled" > $OUT/h/gpu-tests.log 2>&1

# 4. (nvidia-h200 after give_back: an H200) before / grouped / both, then the LoRA GPU tests
for v in old grouped both; do ...as in 1, timeout 190, --out_dir $OUT/g/lora-$v...; done
PYTHONPATH=/tmp/site:$R timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py tests/test_lora_analysis.py > $OUT/g/gpu-tests.log 2>&1

# 5. (nvidia-h100-x1, fresh) next/joint-dgrad as the tree (triton_op version), next/old = main at 5e8a5f3
(PYTHONPATH=/tmp/site:$R timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_fused_rope.py tests/test_lora.py -k "frozen or lora or unit" > $OUT/j/gpu-tests.log 2>&1)
for v in old joint; do ...as in 1 with joint = the tree, timeout 185, --out_dir $OUT/j/lora-$v...; done

# 6. (fresh) the joint op writing from a column offset instead of a view: the first GPU test failed the same way (log not kept)
# 7. (fresh, machine C) TORCH_LOGS=output_code,aot_graphs of that failing test, to find the copy (log not kept; README item 5 says what it showed)
# 8. (machine C) the joint op as torch.library.custom_op; joint failed (joint-dgrad.log), then main
for v in joint old; do ...as in 1, timeout 135, --out_dir $OUT/m/lora-$v...; done
