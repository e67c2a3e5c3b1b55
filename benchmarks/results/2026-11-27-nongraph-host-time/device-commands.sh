# The device commands behind this study, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl). .diag/profile_step.py was a throwaway diagnosis script (not kept): for BF16
# and the default FP8 it called cs336_basics.measurement.warmed_up_preset("366m", fp8, "default", 6), then
# benchmark.host_time.host_and_wall(trainer, 10), the same under torch.compiler.set_stance(skip_guard_eval_unsafe=True),
# one torch.profiler step (kernel counts) and cProfile over 5 steps; its output is logs.tar.gz's h100-diagnosis.log.

# Command A, nvidia-h100-x1 (H100 A), commit 0c4d2c9 (before the fix):
timeout 170 python3 .diag/profile_step.py 366m > $OUT/diag.log 2>&1

# Command B, nvidia-h200, commit 1311937 (the fix):
S="--presets 366m --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2"
timeout 200 python3 optimize_performance.py $S --compile default --out_dir $OUT/nographs > $OUT/nographs.log 2>&1   # compile-default-h200.json

# Command C, nvidia-h100-x1 (H100 B), commit 1311937; .ab/before holds cs336_basics as of 9ce94a6 (main before the fix):
(cd .ab/before && PYTHONPATH=/tmp/site timeout 90 python3 -m cs336_basics.benchmark.host_time --presets 366m --precisions fp8 --compile default --json $OUT/host-before.json)   # host-time-before-h100.json
timeout 120 python3 -m cs336_basics.benchmark.host_time --presets 366m --precisions bf16,fp8 --compile default --json $OUT/host-after.json   # host-time-after-h100.json
timeout 200 python3 optimize_performance.py $S --compile default --out_dir $OUT/nographs > $OUT/nographs.log 2>&1   # compile-default-h100.json (FP8's second run cut by the timeout)
