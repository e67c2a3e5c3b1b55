#!/usr/bin/env bash
# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1;
# (torchao 0.18.0 carried as a wheel), torch 2.11.0+cu130, triton 3.6.0. Each call on a freshly started machine
# (empty compile caches). logs.tar.xz holds call1/ to call3/. (The device's own git metadata lags the tree it is
# given: its `git log` is not the code.)
#
# call 1, nvidia-h200-x2 (2 x H200, 32 CPU cores), tree 366c0e0 (main): FSDP2 x2, 1.3b batch 4 per GPU, auto (then:
# no CUDA graphs under FSDP2, the fused FP8 step with the C++ wrapper) against reduce-overhead, one first run each
W=2
python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 \
  --compile auto,reduce-overhead --world_sizes $W --parallel fsdp --cold --repeats 1 --timeout_s 260 \
  --out_dir $OUT/g$W > $OUT/g$W.log 2>&1
python3 -m lab.step_series $OUT/g$W/sweep.json
#
# call 2, nvidia-h200-x2 (another host), tree 366c0e0 + the change of this record (auto_compile_mode: CUDA graphs for
# the FP8 step under FSDP2 without accumulation; committed as the commit that adds this record): the new default,
# two first runs a side; then 200 steps of 1.3b on real text (the image's CPython stdlib) under FSDP2, BF16 against
# the default FP8
python3 optimize_performance.py --presets 1.3b --precisions bf16,fp8 --attention sdpa --ac off --steps 20 \
  --compile auto --world_sizes $W --parallel fsdp --cold --repeats 2 --timeout_s 200 \
  --out_dir $OUT/d$W > $OUT/d$W.log 2>&1
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; print(prepare_data(DataConfig(), 32000).description)"
timeout 270 python3 -m lab.loss_parity --out_dir $OUT/p$W --variants bf16,fp8 --preset 1.3b --nproc_per_node $W \
  --parallel fsdp --max_steps 200 --eval_every 50 --eval_batches 16 --log_every 10 --checkpoint_every 0 > $OUT/p$W.log 2>&1
#
# call 3, nvidia-h200 (1 x H200; the 2-GPU kind was no longer lent), the same tree: the one-GPU GPU tests of the
# main job's CLI and of LoRA (last session's three commits after its GPU tests: absolute input paths, the LoRA base's
# dtype in the summary, a .npy's smallest id computed once)
timeout 230 python3 -m pytest -q -m gpu tests/test_train_cli.py tests/test_lora.py -p no:cacheprovider > $OUT/t1.log 2>&1
#
# call 4, nvidia-h200 (1 x H200), tree fcf9a99 (main later this session: the other ranks wait for rank 0's data in a
# gloo group of their own, checkpoints record their ranks and mode, generate/export read a checkpoint once): FSDP2's
# one-rank CUDA-graph GPU tests, under torchrun with NCCL. (Its -k also deselected test_train_cli's GPU tests.)
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=6 "tests/test_distributed.py" -k "fsdp2_under_cuda_graphs" tests/test_train_cli.py > $OUT/t2.log 2>&1
#
# call 5, nvidia-h200 (1 x H200), tree c5b734f (the code of fcf9a99): the main job's GPU tests, after config.json
# began keeping FP8 on/off, dtype and compiling as asked where left automatic (a resume chooses them again)
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=6 tests/test_train_cli.py > $OUT/t3.log 2>&1
#
# call 6, nvidia-h200 (1 x H200), tree 143054f: the verify tool's GPU tests, after its verdict, report and LoRA path
# line changed
timeout 185 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=4 tests/test_verify_fp8.py > $OUT/t4.log 2>&1
