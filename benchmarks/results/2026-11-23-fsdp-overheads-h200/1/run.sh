# One device command on nvidia-h200 (carry: .whl, scratch/tok, this folder), from the repository root.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
M=benchmarks/results/2026-11-23-fsdp-overheads-h200/measure.py
T="python3 -m torch.distributed.run --standalone --nproc_per_node 1"
python3 $M plain-bf16 bf16 plain
python3 $M plain-fp8 fp8-tensorwise plain
$T $M fsdp-bf16 bf16 fsdp
$T $M fsdp-bf16-kept bf16 fsdp --no_fsdp_reshard_after_forward
$T $M fsdp-fp8 fp8-tensorwise fsdp
$T $M fsdp-fp8-kept fp8-tensorwise fsdp --no_fsdp_reshard_after_forward
$T $M fsdp-fp8-fp8gather fp8-tensorwise fsdp --fp8_all_gather
$T $M fsdp-fp8-fp8gather-kept fp8-tensorwise fsdp --fp8_all_gather --no_fsdp_reshard_after_forward
python3 -c "
import json, os
from cs336_basics.results import write_results
runs = [json.loads(line) for line in open(os.environ['OUT'] + '/runs.jsonl')]
write_results(os.environ['OUT'] + '/sweep.json', runs, command='bash benchmarks/results/2026-11-23-fsdp-overheads-h200/1/run.sh')
"
