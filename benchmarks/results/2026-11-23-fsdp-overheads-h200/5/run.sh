# The fifth device command on nvidia-h200 (a fresh machine): the fused FP8 path under FSDP2 (one rank), against
# torchao's FP8 and BF16 under FSDP2 and the same precisions in one plain process.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
M=benchmarks/results/2026-11-23-fsdp-overheads-h200/measure.py
T="python3 -m torch.distributed.run --standalone --nproc_per_node 1"
$T $M fsdp-bf16 bf16 fsdp
$T $M fsdp-fp8 fp8-tensorwise fsdp
$T $M fsdp-fused fp8-fused-dynamic fsdp
python3 $M plain-bf16 bf16 plain
python3 $M plain-fused fp8-fused-dynamic plain
python3 -c "
import json, os
from cs336_basics.results import write_results
runs = [json.loads(line) for line in open(os.environ['OUT'] + '/runs.jsonl')]
write_results(os.environ['OUT'] + '/sweep.json', runs, command='bash benchmarks/results/2026-11-23-fsdp-overheads-h200/5/run.sh')
"
