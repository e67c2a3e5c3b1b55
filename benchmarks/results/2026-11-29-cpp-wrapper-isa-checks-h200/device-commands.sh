# The device command behind this record, verbatim. One nvidia-h200 request (1 x H200, 16 vCPUs, KVM guest; a freshly
# started machine), main at 6765c7e, torch 2.11.0+cu130, triton 3.6.0, torchao 0.18.0 (its wheel carried in .whl):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; COLD_S=170 WARM_S=100 PROF_S=100 bash .ab/cpp.sh 2>&1
# The session's device budget ended the call (at 382 s) after the profiled run had written warm.prof, before the
# script's last lines: the returned warm.prof was summarized locally (logs.tar.xz: warm-profile-top40.txt) with
#   python -c "import pstats; pstats.Stats('warm.prof').sort_stats('cumulative').print_stats(40)"
# cpp-wrapper-compile.json gathers the two result.json records that came back (cold, warm), the profiled run's done
# line, and the two fresh processes' check timings (stdout, in logs.tar.xz).
#
# ===== .ab/cpp.sh
#   # h200 one GPU: where does the C++ wrapper's compile time go on a warm run? (366m FP8, --compile_mode default, where
#   # auto picks the C++ wrapper; its warm runs compiled 43-66 s in earlier records, the Python wrapper's cold ones 10-20 s)
#   nvidia-smi -L; lscpu | grep -i "^CPU(s)\|model name"; grep -o 'avx512[a-z_0-9]*\|avx2\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
#   M=$PWD; mkdir -p $OUT/cpp; C=$(mktemp -d); mkdir -p $C/tmp
#   export TORCHINDUCTOR_CACHE_DIR=$C/inductor TRITON_CACHE_DIR=$C/triton TMPDIR=$C/tmp
#   for i in 1 2; do python3 -c "
#   import time; t=time.time(); import torch; ti=time.time()-t
#   from torch._inductor.cpu_vec_isa import valid_vec_isa_list
#   t=time.time(); v=valid_vec_isa_list(); print('isa', [str(x) for x in v], 'checks', round(time.time()-t,1), 's; import torch', round(ti,1), 's')" 2>&1 | grep isa; done
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   A="--preset 366m --max_steps 6 --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --compile_mode default"
#   timeout -k 5 ${COLD_S:-190} python3 train_h100.py $A --out_dir $OUT/cpp/cold > $OUT/cpp/cold.log 2>&1; echo "cold rc $?"; grep -E "^done|compile  " $OUT/cpp/cold.log | tail -2
#   (cd $OUT && tar cJf cpp.tar.xz cpp)
#   timeout -k 5 ${WARM_S:-100} python3 train_h100.py $A --out_dir $OUT/cpp/warm > $OUT/cpp/warm.log 2>&1; echo "warm rc $?"; grep -E "^done" $OUT/cpp/warm.log
#   (cd $OUT && tar cJf cpp.tar.xz cpp)
#   timeout -k 5 ${PROF_S:-110} python3 -m cProfile -o $OUT/cpp/warm.prof train_h100.py $A --out_dir $OUT/cpp/warm-prof > $OUT/cpp/warm-prof.log 2>&1; echo "warm-prof rc $?"; grep -E "^done" $OUT/cpp/warm-prof.log
#   python3 -c "
#   import pstats; p = pstats.Stats('$OUT/cpp/warm.prof'); p.sort_stats('cumulative')
#   for f in ('_precompile_header', 'pick_vec_isa', 'valid_vec_isa_list', 'load_async', 'load_pybinding', 'check_build', 'compile_fx', 'aot_module_simplified', '_reload_python_module'):
#       for k, v in p.stats.items():
#           if k[2] == f: print(f'{f:24} calls {v[1]:4d} cumulative {v[3]:7.1f} s  ({k[0].split(\"site-packages/\")[-1]}:{k[1]})')
#   " 2>&1 | head -30
#   (cd $OUT && tar cJf cpp.tar.xz cpp)
