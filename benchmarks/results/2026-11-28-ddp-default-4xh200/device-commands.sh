# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), on main at 3ddb641 with this commit's lab.host_time --ddp_bucket_mb
# (torch 2.11.0+cu130). One nvidia-h100-x4 request, given 4 x H200 (143,771 MiB each), 64 CPU cores; the commands
# ran one after the other on that machine. The lanes (python -m lab.lanes) ran each job on GPUs of its own; .ab/
# (carried) held the jobs files and two helpers: .ab/call1.sh and .ab/summary.py are reproduced verbatim in
# ../2026-11-28-ddp-levers-4xh200/device-commands.sh, unchanged since.

# Command 1 (x2-cold/; the probe in it stopped at once: lab.host_time did not accept --compile auto then):
# .ab/s1.jobs:
#   # Session 2026-11-28b call 1: #55 the new DDP default on first runs, and where DDP's time goes (warm probe).
#   ddp2-default 2  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   ddp2-comm    2  torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --precisions bf16,fp8 --compile auto --ddp_bucket_mb 25,100,400 --json $JOB_OUT/host-ddp2.json
LANES_S=540 JOB_S=530 bash .ab/call1.sh s1; grep -h "tok/s" $OUT/lanes/ddp2-comm.log | tail -8

# Command 2 (x2-probe/, x2-accumulation/default-then.json):
# .ab/s2.jobs:
#   ddp2-comm    2  torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --precisions bf16,fp8 --compile reduce-overhead --ddp_bucket_mb 25,100,400 --json $JOB_OUT/host-ddp2.json
#   ddp2-accum   2  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --gradient_accumulation_steps 4 --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
LANES_S=560 JOB_S=555 bash .ab/call1.sh s2; grep -h "tok/s" $OUT/lanes/ddp2-comm.log | tail -8

# Command 3 (x2-accumulation/fp8-graphs.json and fp8-no-graphs.json, x4-cold/):
# .ab/s3.jobs:
#   accum-graphs   2  python3 optimize_performance.py --presets 1.3b --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile reduce-overhead --gradient_accumulation_steps 4 --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   accum-nographs 2  python3 optimize_performance.py --presets 1.3b --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile default --gradient_accumulation_steps 4 --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   ddp4-default   4  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel ddp --out_dir $JOB_OUT
LANES_S=570 JOB_S=560 bash .ab/call1.sh s3 2>&1 | grep -v "^\[data\]\|encode"

# Command 4 (the GPU tests; logs.tar.xz: command4-tests-distributed.log):
git log --oneline -1 2>/dev/null; timeout 360 python3 -m pytest -v -m gpu tests/test_distributed.py -p no:cacheprovider > $OUT/tests-distributed.log 2>&1; echo rc $?; grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" $OUT/tests-distributed.log | tail -15
