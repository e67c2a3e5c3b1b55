# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl).
#
# Command 1, h200-ab/: nvidia-h100-x4, which ran on 4 x H200 (64 CPU cores), a fresh machine (empty compile caches).
# main = 3150415 (the checkout); .ab/rope = `git archive wip/rope-one-launch` at 4cfad16 (main's 0d5328c merged in;
# the same rope code as 0c65e79, main after the merge), carried. `timeout 585 bash .ab/matrix.sh`, which was:
# Mode-matrix A/B of the rope one-launch branch (.ab/rope) against main ($PWD), FP8 only, one lane per GPU, all at once.
R=$PWD/.ab/rope; M=$PWD
S="--precisions fp8 --attention sdpa --ac off --steps 20 --repeats 2"
lane() {  # lane NAME GPUS TREE ARGS...
  local name=$1 gpus=$2 tree=$3; shift 3
  (cd $tree && CUDA_VISIBLE_DEVICES=$gpus PYTHONPATH=/tmp/site:$tree timeout 250 "$@" > $OUT/ab/$name.log 2>&1; echo "rc $?" >> $OUT/ab/$name.log)
}
mkdir -p $OUT/ab
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; print(prepare_data(DataConfig(), 32000).description)"  # once, before the lanes race to build it
( for t in main rope; do tree=$M; [ $t = rope ] && tree=$R; lane graphs-$t 0 $tree python3 optimize_performance.py --presets 366m $S --repeats 1 --compile auto --out_dir $OUT/ab/graphs-$t; done
  for t in main rope; do tree=$M; [ $t = rope ] && tree=$R; lane probe-$t 0 $tree python3 -m lab.host_time --presets 366m --precisions fp8 --compile default --top_ops 30 --json $OUT/ab/probe-$t.json; done ) &
( for t in main rope main rope; do tree=$M; [ $t = rope ] && tree=$R; lane accum-$t-$SECONDS 1 $tree python3 optimize_performance.py --presets 366m $S --repeats 1 --compile auto --gradient_accumulation_steps 4 --out_dir $OUT/ab/accum-$t-$SECONDS; done ) &
( for t in main rope; do tree=$M; [ $t = rope ] && tree=$R; lane ddp2-$t 2,3 $tree python3 optimize_performance.py --presets 1.3b $S --repeats 1 --compile auto --world_sizes 2 --parallel ddp --out_dir $OUT/ab/ddp2-$t; done ) &
wait
cd $OUT && tar czf ab.tgz ab && python3 - <<'PY'
import json, glob
for f in sorted(glob.glob("ab/*/sweep.json")):
    for r in json.load(open(f))["runs"]:
        print(f.split("/")[1], r["status"], round(r.get("tokens_per_sec") or 0), r.get("compile_s") and round(r["compile_s"]), r.get("step_ms_p10") and round(r["step_ms_p10"], 1), r.get("step_ms_p90") and round(r["step_ms_p90"], 1))
for f in sorted(glob.glob("ab/probe-*.json")):
    r = json.load(open(f))["runs"][0]
    print(f, round(r["tokens_per_sec"]), "wall", round(r["wall_ms"], 2), "host", round(r["host_ms"], 2), "fwd", round(r["forward_ms"], 2))
PY

# Command 2, h100-nographs-cold/: nvidia-h100-x1 (one H100 80GB HBM3, 16 CPU cores), a fresh machine; main at 0c65e79
# (the rope branch merged). Issue #54's row for --compile default, first runs: every run a fresh process with empty
# compile caches (--cold). One BF16 run and two FP8 runs, as two sweeps: three a side did not fit the session's
# device time (each cold run with the C++ wrapper compiles 80-95 s).
S="--presets 366m --attention sdpa --ac off --steps 20 --cold --compile default"
timeout 150 python3 optimize_performance.py $S --precisions bf16 --repeats 1 --out_dir $OUT/nographs-bf16 > $OUT/nographs-bf16.log 2>&1
timeout 300 python3 optimize_performance.py $S --precisions fp8 --repeats 2 --out_dir $OUT/nographs-fp8 > $OUT/nographs-fp8.log 2>&1
