# The second device command on nvidia-h200 (a fresh machine): the configuration the first ran out of time for
# (run.sh hit the device's 10-minute limit during its last line), and three of the others again.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
M=benchmarks/results/2026-11-23-fsdp-overheads-h200/measure.py
T="python3 -m torch.distributed.run --standalone --nproc_per_node 1"
$T $M fsdp-fp8-fp8gather-kept fp8-tensorwise fsdp --fp8_all_gather --no_fsdp_reshard_after_forward
$T $M fsdp-fp8-fp8gather fp8-tensorwise fsdp --fp8_all_gather
$T $M fsdp-bf16 bf16 fsdp
$T $M fsdp-fp8 fp8-tensorwise fsdp
python3 -c "
import json, os
from cs336_basics.results import write_results
runs = [json.loads(line) for line in open(os.environ['OUT'] + '/runs.jsonl')]
write_results(os.environ['OUT'] + '/sweep.json', runs, command='bash benchmarks/results/2026-11-23-fsdp-overheads-h200/2/run.sh')
"
