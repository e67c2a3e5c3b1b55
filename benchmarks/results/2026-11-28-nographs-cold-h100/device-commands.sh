# The device commands behind this study, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl). Both on nvidia-h100-x1 (one H100 80GB HBM3, 16 CPU cores), the same
# machine (GPU-dca73f8d), main at ae7be1b. Logs: logs.tar.xz.

# Command 1 (after the GPU tests of the rope branch, ../2026-11-28-gpu-tests/): the in-process probe, both compile
# modes, auto's wrapper (C++ for default, Python under CUDA graphs). Its time limit stopped it during the fourth
# configuration (FP8 under CUDA graphs), before it wrote its JSON: the three finished rows are in
# logs/host-time-probe-h100.log only.
H="python3 -m lab.host_time --presets 366m --compile default,reduce-overhead --compile_wrappers auto"
timeout 170 $H --precisions bf16,fp8 --json $OUT/host-main.json > $OUT/host-main.log 2>&1

# Command 2, the next call on the same machine: issue #54's row for --compile default, first runs (each run a fresh
# process with empty compile caches and an empty temporary folder), two runs a side, the sides taking turns.
python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold \
  --repeats 2 --compile default --out_dir $OUT/nographs > $OUT/nographs.log 2>&1    # sweep.json, sweep.md, sweep.png
