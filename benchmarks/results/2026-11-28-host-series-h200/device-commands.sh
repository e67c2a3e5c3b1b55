# The device command behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130, triton 3.6.0. One nvidia-h200 request (1 x H200,
# 16 CPU cores). The tree: main at 8b51ecb with the change committed as 4ae2158 (the per-step host series, where
# host_cpu_ms was then the loop thread's CPU time; 4115b5c made it the process's, before anything was committed).
# Run as `bash callA.sh`; logs.tar.xz holds tests.log, nographs.log and the sweep's per-run logs.
#
# callA.sh:
nvidia-smi -L; lscpu | grep -i "^CPU(s)\|model name"
M=$PWD
python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
timeout -k 5 270 python3 -m pytest -m gpu -p no:cacheprovider -v --durations=10 "tests/test_verify_fp8.py::test_gpu_mode_verifies_a_lora_fine_tune_compiled" tests/test_hf_doctor.py tests/test_host_time.py tests/test_collector.py > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/tests.log | tail -12
timeout 280 python3 optimize_performance.py --presets 366m --precisions bf16,fp8 --attention sdpa --ac off --steps 30 --compile default --vary gc_every=0,50 --cold --timeout_s 150 --out_dir $OUT/nographs > $OUT/nographs.log 2>&1
echo "sweep rc $?"
cd $OUT && tar cJf nographs.tar.xz nographs nographs.log   # then a summary printed from nographs/sweep.json
