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

# Command 1, nvidia-h200-x4: 4 x H200 (143,771 MiB each), 64 CPU cores, a fresh machine:
# .ab/call1.jobs:
#   # Call 1: #54's 1.3b accumulation-4 row (BF16 3 runs, FP8 3 runs, each a fresh process with empty caches), then the
#   # GPU tests not yet run on the device.
#   accum13-fp8a  1  python3 optimize_performance.py --presets 1.3b --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   accum13-fp8b  1  python3 optimize_performance.py --presets 1.3b --precisions fp8 --attention sdpa --ac off --steps 20 --cold --repeats 1 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   accum13-bf16a 1  python3 optimize_performance.py --presets 1.3b --precisions bf16 --attention sdpa --ac off --steps 20 --cold --repeats 2 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   accum13-bf16b 1  python3 optimize_performance.py --presets 1.3b --precisions bf16 --attention sdpa --ac off --steps 20 --cold --repeats 1 --compile auto --gradient_accumulation_steps 4 --out_dir $JOB_OUT
#   tests-dist    2  python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_distributed.py
#   tests-one     1  python3 -m pytest -v -p no:cacheprovider -m gpu tests/test_accumulation.py tests/test_host_time.py tests/test_verify_fp8.py
bash .ab/call1.sh call1
