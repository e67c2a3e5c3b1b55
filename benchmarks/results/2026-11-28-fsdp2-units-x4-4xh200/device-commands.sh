# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130. Four nvidia-h200-x4 requests, one after the other on
# one machine (4 x H200, 143,771 MiB each, 64 CPU cores), each fired as the one before returned.
# Two trees: main at a7ec170 ($PWD) and branch wip/fsdp2-compiled-root at 367ef21, unpacked beside it as .ab/root by
#   git archive wip/fsdp2-compiled-root cs336_basics lab optimize_performance.py train_h100.py verify_fp8_compilation.py tests pyproject.toml
# (the branch: the embedding and the output are compiled regions under FSDP2 too, and --fsdp_blocks_per_unit N).

# Command A (main; fsdp4-rank/, ddp4-ctas/; logs.tar.xz: logs/command-a/): two jobs run one after the other by the
# lanes (python -m lab.lanes, all 4 GPUs each). The lanes' `timeout` (520 s) stopped the second job during its third
# sweep (NCCL_MAX_CTAS=8), which wrote nothing ("interrupted before any configuration finished"; its log).
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; print(prepare_data(DataConfig(), 32000).description)"
#   timeout 520 python3 -m lab.lanes --gpus 4 --timeout_s 330 --out $OUT/lanes jobs
# with jobs:
#   fsdp4-rank  4  torchrun --standalone --nproc_per_node 4 -m lab.host_time --presets 1.3b --compile auto --precisions bf16,fp8 --parallel fsdp --json $JOB_OUT/host.json
#   ddp4-ctas   4  for c in default 16 8; do w=4; if [ $c = default ]; then unset NCCL_MAX_CTAS; w=1,4; else export NCCL_MAX_CTAS=$c; fi; python3 optimize_performance.py --presets 1.3b --precisions fp8 --attention sdpa --ac off --steps 20 --repeats 1 --compile auto --world_sizes $w --parallel ddp --out_dir $JOB_OUT/ctas-$c; done

# Command B (branch; units4-a/; logs.tar.xz: logs/command-b/):
R=$PWD/.ab/root; cd $R && PYTHONPATH=/tmp/site:$R timeout 520 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --compile auto --world_sizes 4 --parallel fsdp --timeout_s 250 --vary fsdp_blocks_per_unit=2,1 --out_dir $OUT/units4

# Command C (branch; units4-b/; logs.tar.xz: logs/command-c/):
R=$PWD/.ab/root; cd $R && PYTHONPATH=/tmp/site:$R timeout 530 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --compile auto --world_sizes 4 --parallel fsdp --timeout_s 250 --vary fsdp_blocks_per_unit=4,2 --out_dir $OUT/units4b

# Command D (branch; units4-c/; logs.tar.xz: logs/command-d/):
R=$PWD/.ab/root; cd $R && PYTHONPATH=/tmp/site:$R timeout 300 python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --compile auto --world_sizes 4 --parallel fsdp --timeout_s 230 --vary fsdp_blocks_per_unit=2 --out_dir $OUT/units4c
