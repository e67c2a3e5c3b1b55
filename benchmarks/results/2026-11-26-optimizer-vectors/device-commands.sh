# The device commands behind this folder, verbatim but for the common prefix every one started with (torchao
# installed as in shared/GUIDE.md), run from the checkout root; each wrote under $OUT, copied here.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit

# h200/compile-scope-1.3b (679f619)
mkdir -p $OUT/scope; S=$(date +%s); for scope in blocks model; do left=$(( 570 - ($(date +%s) - S) )); timeout $left python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 1 --cold --timeout_s 260 --compile_scope $scope --out_dir $OUT/scope/$scope > $OUT/scope/$scope.log 2>&1; echo "$scope rc=$? t=$(( $(date +%s) - S ))"; tail -8 $OUT/scope/$scope.log; done

# h200/amdahl-1.3b-by-scope (679f619)
mkdir -p $OUT/prof; S=$(date +%s); for scope in blocks model; do left=$(( 580 - ($(date +%s) - S) )); timeout $left python3 -m cs336_basics.benchmark.amdahl --preset 1.3b --attention sdpa --compile_scope $scope --top_kernels 40 --json $OUT/prof/$scope.json > $OUT/prof/$scope.log 2>&1; done

# h100/optimizer (main = 679f619 in the worktree .gpu/, new = 8c05573 in the checkout)
mkdir -p $OUT/opt; for p in 1.3b 366m; do python3 .base/tune_optimizer.py $p 2>&1 | tee $OUT/opt/tune-$p.log; done; R=$PWD; for i in 1 2; do for side in main new; do d=$R; [ $side = main ] && d=$R/.gpu; (cd $d && PYTHONPATH=/tmp/site:$d python3 -m cs336_basics.benchmark.optimizer_step --presets 366m 1.3b --variants masters-fused --json $OUT/opt/step-$i-$side.json); done; done

# h100/cold-366m and h100/cold-gpt2-small-cut (8c05573's package; the command ran out of time during gpt2-small)
S=$(date +%s); for p in 366m gpt2-small; do left=$(( 590 - ($(date +%s) - S) )); timeout $left python3 optimize_performance.py --presets $p --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 110 --out_dir $OUT/cold-$p > $OUT/cold-$p.log 2>&1; done

# h100/gpu-tests/optim-8c05573-tolerance-failure.log, h100/cold-1.3b-cut, h100/gpu-tests/train-cli-host-time-memory-peak.log (8c05573)
python3 -m pytest -m gpu tests/test_optim.py -q -p no:cacheprovider > $OUT/gpu-tests-optim.log 2>&1
timeout 330 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 3 --cold --timeout_s 150 --out_dir $OUT/cold-1.3b > $OUT/cold-1.3b.log 2>&1
python3 -m pytest -m gpu tests/test_train_cli.py tests/test_host_time.py tests/test_memory_peak.py -q -p no:cacheprovider > $OUT/gpu-tests-train.log 2>&1

# h100/gpu-tests/optim-final.log, h100/cold-1.3b-one-pair (9f6cccc)
python3 -m pytest -m gpu tests/test_optim.py -q -p no:cacheprovider > $OUT/gpu-tests-optim.log 2>&1
timeout 190 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --compile auto --attention sdpa --ac off --steps 20 --repeats 1 --cold --timeout_s 150 --out_dir $OUT/cold-1.3b-x1 > $OUT/cold-1.3b-x1.log 2>&1
