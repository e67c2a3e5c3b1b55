# The device commands behind this folder, in the order they ran, verbatim but for the common prefix every one started
# with (torchao installed as in shared/GUIDE.md), run from the checkout root of main at 9e96313 on an H100 80GB HBM3.
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit

# 1. scope-model (a machine just started), then scope-blocks with the GPU tests (the same machine)
python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --compile_scope model --out_dir $OUT/lora-model > $OUT/lora-model.log 2>&1
python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn --compile_scope blocks --out_dir $OUT/lora-blocks > $OUT/lora-blocks.log 2>&1
timeout 280 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_verify_fp8.py tests/test_fused_head.py > $OUT/gpu-tests.log 2>&1

# 2. host-probe: the probe ran as an untracked next/lora_host.py. host-probe/lora_host_probe.py is the same code split
#    into functions for lint, its timing loop now cs336_basics.benchmark.host_time.host_and_wall (the loop it had copied). Three runs: the first stopped after the BF16 base on a bug of the probe
#    (it did not restore trainer.step_model; its BF16 line matches run 1's), run 1 added nothing else, run 2 added the
#    runtime-call listing.
python3 next/lora_host.py --preset 1.3b --lora_rank 16 --lora_targets attn 2>&1 | grep -v "Warning\|encode\|train:\|warn_once" | tee $OUT/lora-host.log

# 3. fast-accum-ab, with the fixed GPU test (tests/test_verify_fp8.py as committed with this folder)
for v in default fastacc; do extra=""; [ $v = fastacc ] && extra="--fp8_fast_accum_backward"; timeout 230 python3 optimize_performance.py --presets 1.3b --lora_ranks 16 --lora_targets attn $extra --out_dir $OUT/lora-$v > $OUT/lora-$v.log 2>&1; done
timeout 150 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_verify_fp8.py -k lora > $OUT/gpu-tests.log 2>&1

# 4. lora-parity-fast-accum (checkpoints left on the device)
timeout 150 python3 train_h100.py --preset 366m --max_steps 300 --out_dir /tmp/base366 > /tmp/base.log 2>&1
timeout 220 python3 -m cs336_basics.benchmark.loss_parity --variants bf16,fp8 --preset 366m --init_from /tmp/base366 --lora_rank 16 --lora_targets attn --max_steps 200 --eval_every 50 --eval_batches 16 --fp8_fast_accum_backward --out_dir /tmp/parity > /tmp/parity.log 2>&1
