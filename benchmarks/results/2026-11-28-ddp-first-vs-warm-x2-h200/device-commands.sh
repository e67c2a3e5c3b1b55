# The device command behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130. One nvidia-h200-x2 request (2 x H200, 32 CPU cores).
# The tree was main at bb03adc with the working-tree changes that became 86291cc (the gradient amaxes rescaled on a
# resume at another world size, and the tests of it), but for one line of the new GPU test (see README.md).
# bash .ab/s55-d.sh, whose text follows:
nvidia-smi --query-gpu=name --format=csv,noheader | head -1; git log --oneline -1 2>/dev/null
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
P="python3 -m pytest -v -m gpu -p no:cacheprovider --durations=8"
(CUDA_VISIBLE_DEVICES=0 timeout 200 $P tests/test_fused_fp8.py > $OUT/fused-fp8-tests.log 2>&1) &
timeout 230 $P tests/test_distributed.py -k "not four" > $OUT/distributed-tests.log 2>&1
wait; tail -1 $OUT/fused-fp8-tests.log; tail -1 $OUT/distributed-tests.log
# Compile caches of their own, empty at the first sweep (a first run), filled for the second (a warm rerun).
C=$(mktemp -d); mkdir -p $C/tmp; export TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton TMPDIR=$C/tmp
S="--presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --repeats 1 --compile auto --world_sizes 2 --parallel ddp"
timeout 200 python3 optimize_performance.py $S --out_dir $OUT/ddp2/first > $OUT/ddp2-first.log 2>&1; echo "first rc $?"
timeout 150 python3 optimize_performance.py $S --out_dir $OUT/ddp2/warm > $OUT/ddp2-warm.log 2>&1; echo "warm rc $?"
cd $OUT && tar cJf s55-d.tar.xz ddp2 *.log && python3 $OLDPWD/.ab/summary.py ddp2
