# The device command behind this folder, verbatim but for the common prefix (torchao installed as in shared/GUIDE.md,
# PYTHONUNBUFFERED=1), `nvidia-smi` into gpu.txt and the final `tar` of $OUT. The tree was branch
# next/pretrain-joint-dgrad at 1c7c8dd, with an untracked copy of main beside it:
#   next/old/ = `git archive 609f12e cs336_basics optimize_performance.py train_h100.py` (main)

# 1. (nvidia-h100-x1, a machine started for it)
R=$PWD
(PYTHONPATH=/tmp/site:$R timeout 75 python3 -m pytest -m gpu -p no:cacheprovider -q -x tests/test_fused_rope.py tests/test_fused_swiglu.py -k "producer or compiled_fused_unit" > $OUT/f/gpu-tests.log 2>&1)
for v in joint old; do if [ $v = joint ]; then D=$R; else D=/tmp/$v; mkdir -p $D; cp -r next/$v/. $D/; fi; (cd $D && PYTHONPATH=/tmp/site:$D timeout 70 python3 optimize_performance.py --presets 366m --precisions fp8 --compile auto --attention sdpa --ac off --steps 20 --out_dir $OUT/f/pt-$v > $OUT/f/pt-$v.log 2>&1); done
