# The device commands behind this folder, in the order they ran, verbatim but for the common prefix each started with
# (torchao installed as in shared/GUIDE.md, PYTHONUNBUFFERED=1), `nvidia-smi` into gpu.txt and the final `tar` of $OUT.
# The tree was branch next/joint-dgrad (b19b7db for command 1; 3472dd5's content for commands 2-5; main since), with
# an untracked copy of main beside it:
#   next/old/ = `git archive 6d89ce9 cs336_basics optimize_performance.py train_h100.py` (main before this change)
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONUNBUFFERED=1 || exit

# 1. (nvidia-h100-x1, a machine started for it) GPU tests, then joint / main
R=$PWD
(PYTHONPATH=/tmp/site:$R timeout 170 python3 -m pytest -m gpu -p no:cacheprovider -q -x tests/test_fused_rope.py tests/test_fused_swiglu.py tests/test_lora.py -k "frozen or lora or unit or joint or qkv" > $OUT/a/gpu-tests.log 2>&1)
for v in joint old; do if [ $v = joint ]; then D=$R; else D=/tmp/$v; mkdir -p $D; cp -r next/$v/. $D/; fi; (cd $D && PYTHONPATH=/tmp/site:$D timeout 190 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --out_dir $OUT/a/lora-$v > $OUT/a/lora-$v.log 2>&1); done

# 2. (nvidia-h100-x1, a new machine) the GPU tests of every file the change touches and of the FP8 paths sharing its kernels
export PYTHONPATH=/tmp/site:$PWD
timeout 560 python3 -m pytest -m gpu -p no:cacheprovider -q --durations=15 tests/test_fused_swiglu.py tests/test_fused_rope.py tests/test_lora.py tests/test_verify_fp8.py tests/test_fused_head.py tests/test_fused_fp8.py tests/test_fp8.py > $OUT/b/gpu-tests.log 2>&1

# 3. (the same H100) the 366m base, then the LoRA loss parity; its tarball (checkpoints included) was too large to come back
timeout 170 python3 train_h100.py --preset 366m --max_steps 300 --out_dir /tmp/base366 > $OUT/p/base.log 2>&1
timeout 330 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --init_from /tmp/base366 --lora_rank 16 --lora_targets attn --max_steps 200 --eval_every 50 --eval_batches 16 --out_dir $OUT/p/parity > $OUT/p/parity.log 2>&1

# 4. (the same H100) joint / main, then the loss parity again from command 3's base, keeping JSON, JSONL and PNG only
for v in joint old; do ...as in 1, timeout 150, --out_dir $OUT/c/lora-$v...; done
ls /tmp/base366 && (PYTHONPATH=/tmp/site:$R timeout 250 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --init_from /tmp/base366 --lora_rank 16 --lora_targets attn --max_steps 200 --eval_every 50 --eval_batches 16 --out_dir /tmp/parity > $OUT/c/parity.log 2>&1; mkdir -p $OUT/c/parity; cd /tmp/parity && find . -name "*.json" -o -name "*.jsonl" -o -name "*.png" | tar -cf - -T - | tar -xf - -C $OUT/c/parity)

# 5. (nvidia-h200 after give_back: an H200) joint / main, then the LoRA and SwiGLU GPU tests
for v in joint old; do ...as in 1, timeout 160, --out_dir $OUT/g/lora-$v...; done
(PYTHONPATH=/tmp/site:$R timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_lora.py tests/test_fused_swiglu.py > $OUT/g/gpu-tests.log 2>&1)

# 6. (nvidia-h100-x1, a new machine; main at 3472dd5 with this folder's first docs) main / joint, then the pre-training defaults at 366m, one cold run per side
for v in old joint; do ...as in 1, timeout 160, --out_dir $OUT/d/lora-$v...; done
(PYTHONPATH=/tmp/site:$R timeout 230 python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 1 --cold --timeout_s 110 --out_dir $OUT/d/cold-366m > $OUT/d/cold-366m.log 2>&1)

# 7. (the same H100) the pre-training defaults at 366m, three cold runs per side
export PYTHONPATH=/tmp/site:$PWD
timeout 400 python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/e/cold-366m > $OUT/e/cold-366m.log 2>&1
