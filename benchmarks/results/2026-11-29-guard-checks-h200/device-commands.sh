# The device command behind host-time-366m.json and host-time-fsdp2-one-rank.json, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0 carried as a wheel), torch 2.11.0+cu130, triton 3.6.0. One nvidia-h200 request (1 x H200, 16 CPU cores),
# main at 7294185. Run as `bash guards_gpu.sh`; logs.tar.xz holds the two logs.
#
# guards_gpu.sh:
# h200: what dynamo's guard checks cost the host today (skip_guard_eval off vs on), 366m --compile default and FSDP2 one rank 1.3b
nvidia-smi -L; git log --oneline -1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
timeout -k 5 280 python3 -m lab.host_time --presets 366m --compile default --precisions bf16,fp8 --skip_guard_eval off,on --steps 30 --json $OUT/g366.json > $OUT/g366.log 2>&1; echo "366m rc $?"
timeout -k 5 250 python3 -m torch.distributed.run --standalone --nproc_per_node 1 -m lab.host_time --presets 1.3b --parallel fsdp --compile auto --precisions fp8 --skip_guard_eval off,on --steps 30 --json $OUT/gfsdp.json > $OUT/gfsdp.log 2>&1; echo "fsdp rc $?"
python3 - <<'PY'
import json, os
for f in ("g366.json", "gfsdp.json"):
    p = os.path.join(os.environ["OUT"], f)
    if not os.path.exists(p): print(f, "missing"); continue
    for r in json.load(open(p))["runs"]:
        print(f, r["precision"], r.get("parallel"), "skip", r.get("skip_guard_eval"), "wall %.2f host %.2f fwd %.2f gpu_idle %.2f tok/s %.0f" % (r["wall_ms"], r["host_ms"], r["forward_ms"], r["gpu_idle_ms"], r["tokens_per_sec"]))
PY
