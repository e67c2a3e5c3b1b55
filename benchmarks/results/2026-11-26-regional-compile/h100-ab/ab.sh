# The two device commands behind h100-ab/ (run from the checkout root; .base = a worktree of 39466a1; torchao from
# the wheel as in shared/GUIDE.md). PRECISION was fp8 (first command: budget 560 s, timeout_s 250) and then bf16
# (second command: budget 330 s, timeout_s 200, and the loop stopping at 60 s left, not 90); the fp8 loop stopped
# after five processes, at its budget.
PRECISION=${PRECISION:-fp8}; BUDGET=${BUDGET:-560}; LIMIT=${LIMIT:-250}
S=$(date +%s); R=$PWD; i=0
for side in base new base new base new; do
  i=$((i+1)); left=$(( BUDGET - ($(date +%s) - S) )); [ $left -lt 90 ] && break
  d=$R; [ $side = base ] && d=$R/.base
  (cd $d && PYTHONPATH=/tmp/site:$d timeout $left python3 optimize_performance.py --presets 366m \
     --precisions $PRECISION --compile auto --attention sdpa --ac off --steps 20 --repeats 1 --timeout_s $LIMIT \
     --out_dir $OUT/ab-$i-$side > $OUT/ab-$i-$side.log 2>&1)
done
