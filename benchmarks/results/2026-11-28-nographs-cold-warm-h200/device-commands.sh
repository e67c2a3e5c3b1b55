# The device command behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl). nvidia-h100-x4, which ran on 4 x H200; GPU 0 only, nothing else running;
# main at 3150415; the call after ../2026-11-28-gpu-tests-4xh200/ on the same machine.
# Compile caches and the temporary folder (where inductor precompiles the C++ wrapper's headers) in a new empty
# folder, shared by the three sweep runs and the probe: the first run compiles from nothing, as --cold does; the
# second and third find its caches. TORCH_LOGS=recompiles: any recompilation would be in the logs (there is none).
export CUDA_VISIBLE_DEVICES=0; T=$(mktemp -d /tmp/split-XXXX); mkdir -p $T/tmp
S="--presets 366m --attention sdpa --ac off --compile default --steps 30"
export TORCHINDUCTOR_CACHE_DIR=$T/inductor TRITON_CACHE_DIR=$T/triton TMPDIR=$T/tmp TORCH_LOGS=recompiles
timeout 360 python3 optimize_performance.py $S --precisions fp8 --repeats 3 --out_dir $OUT/fp8-cold-then-warm \
  > $OUT/fp8-cold-then-warm.log 2>&1                                                  # sweep.json, sweep.md, sweep.png
timeout 120 python3 -m lab.host_time --presets 366m --precisions fp8 --compile default \
  --json $OUT/fp8-probe-warm.json > $OUT/fp8-probe-warm.log 2>&1                      # host-time-probe.json
