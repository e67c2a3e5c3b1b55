# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), on main at 259eb89 (torch 2.11.0+cu130). The lanes (python -m lab.lanes)
# ran each job on GPUs of its own; .ab/ (carried) held the jobs files and two helpers, reproduced here.
#
# .ab/call1.sh, run as `bash .ab/call1.sh callN` (LANES_S/JOB_S: the lanes' and each job's time limits):
#   # Device command 1: prepare the stdlib data once, then the lanes, then pack the folder (at most 8 files come back).
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; print(prepare_data(DataConfig(), 32000).description)"
#   nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
#   timeout ${LANES_S:-560} python3 -m lab.lanes --gpus 4 --timeout_s ${JOB_S:-555} --out $OUT/lanes .ab/$1.jobs
#   cd $OUT && tar cJf lanes.tar.xz lanes && python3 $OLDPWD/.ab/summary.py lanes; grep -h "passed\|failed\|error" lanes/tests.log | tail -5
#
# .ab/summary.py (prints the table at the end of each call's output from the sweep, parity and lanes JSON files):
#   """Print one line per sweep record (and per parity variant) found under the folders given."""
#   import glob
#   import json
#   import sys
#   
#   for root in sys.argv[1:]:
#       for f in sorted(glob.glob(f"{root}/**/sweep.json", recursive=True)):
#           for r in json.load(open(f))["runs"]:
#               print(f.split("/")[-2], r["preset"], r["precision"], r["compile"], r.get("world_size"), r["status"],
#                     round(r.get("tokens_per_sec") or 0), "runs", [round(t or 0) for t in r.get("tokens_per_sec_runs", [])],
#                     "compile_s", [round(c or 0) for c in r.get("compile_s_runs", [r.get("compile_s")])],
#                     "peak", r.get("peak_mem_gib") and round(r["peak_mem_gib"], 2), "loss", r.get("loss"))
#       for f in sorted(glob.glob(f"{root}/**/parity.json", recursive=True)):
#           for r in json.load(open(f))["runs"]:
#               print("parity", r.get("variant") or r["precision"], r.get("max_abs_rel_gap"), r.get("within_tolerance"),
#                     round(r.get("tokens_per_sec") or 0))
#       for f in sorted(glob.glob(f"{root}/**/lanes.json", recursive=True)):
#           for j in json.load(open(f))["jobs"]:
#               print("lane", j["name"], j["assigned"], j["returncode"], j["timed_out"], j["started_s"] and round(j["started_s"]), j["ended_s"] and round(j["ended_s"]))
#

# Command 2, nvidia-h200-x4: 4 x H200 (143,771 MiB each), 64 CPU cores, warm after command 1 (x2-warm/: the jobs ddp2-auto and ddp2-graphs):
# .ab/call2.jobs:
#   # Call 2: #54's gpt2-small accumulation-4 row (3 runs a side, first runs), the 366m accumulation-4 loss parity on
#   # real text (400 steps; batch 2 x 4 micro-batches = the 16,384 tokens a step of the earlier parity records), and
#   # #55's DDP x2 levers at 1.3b (auto's choice vs the fused path under CUDA graphs).
#   gpt2-fp8a  1  python3 optimize_performance.py --presets gpt2-small --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   gpt2-fp8b  1  python3 optimize_performance.py --presets gpt2-small --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 1 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   gpt2-bf16  1  python3 optimize_performance.py --presets gpt2-small --precisions bf16 --attention sdpa --ac off --steps 20 --cold --repeats 3 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   parity     1  python3 -m lab.loss_parity --out_dir $JOB_OUT --variants bf16,fp8 --preset 366m --compile_mode auto --batch_size 2 --gradient_accumulation_steps 4 --max_steps 400 --eval_every 100 --eval_batches 16 --log_every 10 --checkpoint_every 0
#   ddp2-auto  2  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --repeats 1 --compile auto --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   ddp2-graphs 2 python3 optimize_performance.py --presets 1.3b --precisions fp8-fused-dynamic --attention sdpa --ac off --steps 20 --repeats 1 --compile reduce-overhead --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
bash .ab/call1.sh call2

# Command 3, the same machine (x2-cold/):
# .ab/call3.jobs:
#   # Call 3: #55, 1.3b DDP x2 on first runs (--cold, 2 runs each): auto's choice (BF16; FP8 = TorchAO's path, compile
#   # default) in one lane, the fused path under CUDA graphs (and, once, without them) in the other, at the same time.
#   ddp2-auto-cold    2  python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   ddp2-graphs-cold  2  python3 optimize_performance.py --presets 1.3b --precisions fp8-fused-dynamic --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile reduce-overhead --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
#   ddp2-fused-default-cold 2 python3 optimize_performance.py --presets 1.3b --precisions fp8-fused-dynamic --attention sdpa --ac off --steps 20 --cold --repeats 1 --compile default --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
LANES_S=540 JOB_S=535 bash .ab/call1.sh call3

# Command 4, the same machine (x4-cold/):
# .ab/call4.jobs:
#   # Call 4: #55, 1.3b DDP x4 on first runs (--cold, 2 runs each): BF16 (auto: compile default), then the fused path under CUDA graphs.
#   ddp4-bf16-cold    4  python3 optimize_performance.py --presets 1.3b --precisions bf16 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --world_sizes 4 --parallel ddp --out_dir $JOB_OUT
#   ddp4-graphs-cold  4  python3 optimize_performance.py --presets 1.3b --precisions fp8-fused-dynamic --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile reduce-overhead --world_sizes 4 --parallel ddp --out_dir $JOB_OUT
LANES_S=400 JOB_S=220 bash .ab/call1.sh call4

# Command 5, nvidia-h200-x2: 2 x H200, 32 CPU cores, a fresh machine (x2-accumulation/):
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 optimize_performance.py --presets 1.3b --precisions fp8-fused-dynamic,fp8-tensorwise --attention sdpa --ac off --steps 10 --repeats 1 --compile default --gradient_accumulation_steps 4 --world_sizes 2 --parallel ddp --out_dir $OUT/ddp2-accum > $OUT/ddp2-accum.log 2>&1
tail -c 1500 $OUT/ddp2-accum.log; cd $OUT && tar cJf ddp2-accum.tar.xz ddp2-accum
