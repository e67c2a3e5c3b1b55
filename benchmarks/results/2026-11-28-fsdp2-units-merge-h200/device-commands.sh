# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130. Two trees: main at fdaa29d ($PWD, "main") and branch
# wip/fsdp2-compiled-root at 122cac8 (on fdaa29d) unpacked beside it as .ab/root ("root") by
#   git archive wip/fsdp2-compiled-root cs336_basics lab optimize_performance.py train_h100.py verify_fp8_compilation.py tests pyproject.toml
# Commands 1 and 2: two nvidia-h200-x2 requests, one machine (2 x H200, 32 CPU cores, one NUMA node), the second fired
# as the first returned. Commands 3 and 4: two nvidia-h200-x4 requests, one machine (4 x H200, 64 CPU cores, one NUMA
# node). Each command ran the script below ($1.. = the trees in order; "tests" = the branch's FSDP2 GPU tests).
#
# Command 1 (logs.tar.xz: logs/command-1/):  bash merge-x2.sh tests main root          (tests timed out at 150 s)
# Command 2 (logs/command-2/):               TAG=b TESTS_S=200 bash merge-x2.sh root main tests
# Command 3 (logs/command-3/):               bash merge-x4.sh main root    (merge-x4.sh: merge-x2.sh with x4 and 4 GPUs)
# Command 4 (logs/command-4/):  cd .ab/root && PYTHONPATH=/tmp/site:$PWD timeout 230 python3 -m pytest -m gpu -p no:cacheprovider -rA -q --durations=15 tests > $OUT/gpu-tests-x4.log 2>&1
#   (stopped by its 230 s limit after 8 tests had passed; none had failed)
#
# merge-x2.sh, as it ran:
#   # x2 (~8 min): FSDP2 x2 first runs, one BF16/FP8 pair per tree, the trees in the order given ($@: main and root,
#   # e.g. "main root", then "root main" in the next call); with "tests", first the branch's FSDP2 GPU tests (x2 only).
#   nvidia-smi --query-gpu=name --format=csv,noheader | head -1; nvidia-smi topo -m | head -8; lscpu | grep -i "numa\\|socket\\|^CPU(s)"; which numactl
#   M=$PWD
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   for t in "$@"; do tree=$M; [ $t = root ] && tree=$M/.ab/root; [ $t = tests ] && tree=$M/.ab/root
#     if [ $t = tests ]; then (cd $tree && PYTHONPATH=/tmp/site:$tree timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_distributed.py -k "fsdp and not four" > $OUT/root-tests.log 2>&1; echo "tests rc $?"; tail -1 $OUT/root-tests.log); continue; fi
#     (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 260 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --compile auto --world_sizes 2 --parallel fsdp --timeout_s 230 --out_dir $OUT/x2-$t-${TAG:-a} > $OUT/x2-$t-${TAG:-a}.log 2>&1; echo "$t rc $?"); done
#   cd $OUT && tar cJf merge-x2.tar.xz x2-* $(ls root-tests.log 2>/dev/null) && python3 $M/.ab/summary.py x2-*
