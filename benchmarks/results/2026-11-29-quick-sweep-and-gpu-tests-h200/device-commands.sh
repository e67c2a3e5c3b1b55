# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1;
# (torchao 0.18.0 carried as a wheel), torch 2.11.0+cu130, triton 3.6.0. Six nvidia-h200 requests, each on a
# freshly started machine (1 x H200, 16 CPU cores; empty compile caches), each on the tree named. logs.tar.xz holds
# call1/ to call6/. (The device's own git metadata lags the tree it is given: its `git log` is not the code.)
#
# call 1, tree b3b0c83 + the test of c0e8541 (then uncommitted): the optimizer's GPU tests after
# MasterWeightAdamW.step took each local gradient once, and the FSDP2 CUDA-graph test with its new case
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pytest -q -m gpu tests/test_optim.py tests/test_optimizer_step_bench.py "tests/test_distributed.py::test_gpu_fsdp2_under_cuda_graphs_records_each_graph_once_and_trains_like_fsdp2_without" -p no:cacheprovider --durations=10 2>&1 | tee $OUT/gpu-tests.log | tail -25
#
# call 2, tree abc003f: the sweep a newcomer runs first, on first runs, after the sweep's CLI changed; then its GPU test
(time python3 optimize_performance.py --quick --cold --out_dir $OUT/quick) > $OUT/quick.log 2>&1; echo "quick rc $?"; tail -30 $OUT/quick.log
python3 -m pytest -q -m gpu tests/test_sweep.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/gpu-sweep-test.log
cd $OUT && tar cJf quick.tar.xz quick && rm -rf quick
#
# call 3, tree 309a23b: the main job exactly as the README's first command (with --max_steps 100), sampling from it,
# then the GPU tests of what changed since (the model's RoPE tables, data, the main job's CLI, the verify tool)
nvidia-smi -L
(time python3 train_h100.py --max_steps 100 --out_dir /tmp/run) > $OUT/train.log 2>&1; echo "train rc $?"
python3 -m cs336_basics.programs.generate --out_dir /tmp/run --max_new_tokens 40 > $OUT/generate.log 2>&1; echo "generate rc $?"
cp /tmp/run/result.json /tmp/run/metrics.jsonl /tmp/run/config.json /tmp/run/loss_curve.png $OUT/ 2>/dev/null
grep -E "^done|tokens/s|MFU" $OUT/train.log | tail -3
timeout -k 5 430 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=8 tests/test_model.py tests/test_fused_rope.py tests/test_data.py tests/test_train_cli.py tests/test_verify_fp8.py > $OUT/gpu-tests.log 2>&1; echo "tests rc $?"; tail -14 $OUT/gpu-tests.log
#
# call 6, tree e557f4e: the LoRA GPU tests after the run's input paths became absolute and reads_base
nvidia-smi -L; timeout -k 5 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_lora.py > $OUT/gpu-tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/gpu-tests.log
#
# call 5, tree 248c370: the mode matrix's row without CUDA graphs (.ab/matrix.sh, printed below), M=nographs T=420
#   S="--precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold --repeats 2"
#   timeout -k 5 $T python3 optimize_performance.py --presets 366m $S --compile default --out_dir $OUT/nographs > $OUT/nographs.log 2>&1
#
# call 4, tree fc151fb: the GPU tests of the fine-tuning and run-folder changes
nvidia-smi -L
timeout -k 5 540 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests/test_lora.py tests/test_train_cli.py tests/test_accumulation.py > $OUT/gpu-tests.log 2>&1; echo "tests rc $?"; tail -16 $OUT/gpu-tests.log
