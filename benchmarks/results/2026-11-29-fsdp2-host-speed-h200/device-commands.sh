# The device commands behind this record, verbatim. Every call began with the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl; call 3 needed neither), torch 2.11.0+cu130, triton 3.6.0, main at bb7fefc.
# Three nvidia-h200 requests (1 x H200, 16 vCPUs, KVM guest, 1 thread per core); calls 1 and 2 each started a fresh
# machine, call 3 ran on call 2's, still warm:
#   call 1: bash .ab/bind1.sh 2>&1 | tail -40   (the call's 600 s limit ended its sixth run, warm-bound2, as it started;
#           the pipe into tail held back all output, so the runs came back only in x1.tar.xz, written after each run)
#   call 2: bash .ab/units.sh 2>&1
#   call 3: bash .ab/cpus.sh 2>&1   (no GPU work)
# The .ab/ files were carried untracked; their text follows. lab/cpu_speed.py is side.py's work unit and summary made
# into a tool afterwards; it was not itself run on these machines (its tests run on CPU).

# ===== .ab/bind1.sh
#   # h200 one GPU: FSDP2 on one rank (torchrun, 1 process), 1.3b FP8 (auto's path), a host-bound step (host ~= GPU time):
#   # do the loop's and autograd's threads bound to one CPU (lab/thread_binding_site) make its host faster?
#   nvidia-smi -L; lscpu | grep -i "^CPU(s)\|model name\|thread(s) per core"
#   M=$PWD; mkdir -p $OUT/x1; WARM=$(mktemp -d); mkdir -p $WARM/tmp
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   C="--preset 1.3b --batch_size 4 --max_steps ${STEPS:-62} --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp ${EXTRA}"
#   for arm in ${ARMS:-cold-free cold-bound warm-free warm-bound warm-free2 warm-bound2}; do
#     caches=$WARM; [ "${arm%%-*}" = cold ] && { caches=$(mktemp -d); mkdir -p $caches/tmp; }
#     [ "$arm" = cold-free ] && caches=$WARM
#     PP=$PYTHONPATH; case $arm in *bound*) PP=$M/lab/thread_binding_site:$PYTHONPATH;; esac
#     PYTHONPATH=$PP TORCHINDUCTOR_CACHE_DIR=$caches/inductor TRITON_CACHE_DIR=$caches/triton TMPDIR=$caches/tmp timeout -k 5 ${RUN_S:-200} \
#       python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_h100.py $C --out_dir $OUT/x1/$arm > $OUT/x1/$arm.log 2>&1
#     echo "$arm rc $? $(grep -c '\[thread-binding\]' $OUT/x1/$arm.log) binding lines"; grep -m1 '\[thread-binding\]' $OUT/x1/$arm.log
#     python3 $M/.ab/row.py $OUT/x1/$arm/result.json
#     (cd $OUT && tar cJf x1.tar.xz x1)
#   done

# ===== .ab/row.py
#   import json, sys, statistics as st
#   try:
#       r = json.load(open(sys.argv[1]))
#   except OSError as e:
#       sys.exit(f"   no result: {e}")
#   s = r["step_ms"]; h = r["host_ms"][0]; c = r["host_cpu_ms"][0]
#   print(f"   {r['precision']} tok/s {r['tokens_per_sec']:,.0f} compile {r['compile_s']:.0f} peak {r['peak_mem_gib']:.2f} "
#         f"step med {st.median(s):.1f} p10 {r['step_ms_p10']:.1f} p90 {r['step_ms_p90']:.1f} host med {st.median(h):.1f} "
#         f"cpu med {st.median(c):.1f} loss {r.get('loss')}")

# ===== .ab/units.sh
#   # h200 one GPU: FSDP2 on one rank, 1.3b FP8 (auto's path), 102 steps: 2 vs 4 blocks per FSDP2 unit, in turn, with a
#   # side probe (a fixed Python work unit on CPU 15 alone) timing the host's own speed through every run.
#   nvidia-smi -L; lscpu | grep -i "^CPU(s)\|model name\|thread(s) per core"; grep -i "^steal\|^cpu " /proc/stat | head -1
#   M=$PWD; mkdir -p $OUT/u; CACHE=$(mktemp -d); mkdir -p $CACHE/tmp
#   python3 -c "from cs336_basics.config import DataConfig; from cs336_basics.data import prepare_data; prepare_data(DataConfig(), 32000)" >/dev/null 2>&1
#   python3 $M/.ab/side.py 15 $OUT/u/side.json $OUT/u & SIDE=$!
#   C="--preset 1.3b --batch_size 4 --max_steps ${STEPS:-102} --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp"
#   for arm in ${ARMS:-bpu2-a:2 bpu4-a:4 bpu2-b:2 bpu4-b:4}; do
#     name=${arm%%:*}; k=${arm#*:}
#     TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor TRITON_CACHE_DIR=$CACHE/triton TMPDIR=$CACHE/tmp timeout -k 5 ${RUN_S:-170} \
#       taskset -c 0-14 python3 -m torch.distributed.run --standalone --nproc_per_node 1 train_h100.py $C --fsdp_blocks_per_unit $k --out_dir $OUT/u/$name > $OUT/u/$name.log 2>&1
#     echo "$name rc $? $(date +%s.%N)"; python3 $M/.ab/row.py $OUT/u/$name/result.json
#     (cd $OUT && tar cJf u.tar.xz u)
#   done
#   kill $SIDE; wait $SIDE; grep -i "^cpu " /proc/stat | head -1
#   cd $OUT && tar cJf u.tar.xz u

# ===== .ab/side.py
#   """Side probe: a fixed pure-Python work unit timed back to back on one CPU of its own, plus the times at which
#   the training runs' metrics.jsonl files grow (a line every 10 steps), until SIGTERM; then one JSON file."""
#   import glob, json, os, signal, sys, time
#   cpu, out, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
#   os.sched_setaffinity(0, {cpu})
#   probe, lines, sizes = [], [], {}
#   stop = False
#   def on_term(*_):
#       global stop
#       stop = True
#   signal.signal(signal.SIGTERM, on_term)
#   def work():
#       words = {i: str(i) for i in range(5000)}
#       return sum(len(w) for w in words.values())
#   last_poll = 0.0
#   while not stop:
#       t0 = time.time()
#       work()
#       t1 = time.time()
#       probe.append((round(t0, 4), round(1e3 * (t1 - t0), 4)))
#       if t1 - last_poll > 0.01:
#           last_poll = t1
#           for p in glob.glob(f"{root}/*/metrics.jsonl"):
#               n = os.path.getsize(p)
#               if sizes.get(p) != n:
#                   sizes[p] = n
#                   with open(p) as f:
#                       count = sum(1 for _ in f)
#                   lines.append((round(t1, 4), p, count))
#   json.dump(dict(cpu=cpu, probe=probe, metrics_lines=lines), open(out, "w"))

# ===== .ab/cpus.sh
#   # h200 one GPU machine, no GPU work: is a vCPU's speed set by our own busy CPUs (siblings inside this guest) or from
#   # outside it? The side probe (.ab/side.py, a fixed Python work unit) on CPU sets in phases, nothing else running.
#   lscpu | grep -i "^CPU(s)\|model name\|thread(s) per core\|^NUMA\|L2\|L3"; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list
#   grep "^cpu " /proc/stat; M=$PWD; mkdir -p $OUT/c
#   phase() {  # name seconds cpus...
#     local name=$1 s=$2; shift 2; local pids=()
#     for c in "$@"; do python3 $M/.ab/side.py $c $OUT/c/$name-$c.json /nonexistent & pids+=($!); done
#     sleep $s; kill ${pids[@]}; wait
#     grep "^cpu " /proc/stat
#   }
#   phase one15-a 15 15
#   phase all16 15 $(seq 0 15)
#   phase low8 15 $(seq 0 7)
#   phase even8 15 0 2 4 6 8 10 12 14
#   phase one15-b 30 15
#   phase one0 30 0
#   cd $OUT && tar cJf c.tar.xz c && python3 - <<'PY'
#   import json, glob, statistics as st
#   for p in sorted(glob.glob("c/*.json"), key=lambda p: (p.split("/")[-1].rsplit("-", 1)[0], int(p.rsplit("-", 1)[1][:-5]))):
#       d = json.load(open(p)); v = [x[1] for x in d["probe"]]
#       t0 = d["probe"][0][0]; bins = {}
#       for t, dt in d["probe"]:
#           bins.setdefault(int(t - t0), []).append(dt)
#       print(f"{p}: n {len(v)} median {st.median(v):.3f} ms, slow (>0.95 ms) {sum(x > 0.95 for x in v) / len(v):.0%} | per s: "
#             + " ".join(f"{st.median(b):.2f}" for k, b in sorted(bins.items())))
#   PY

# ===== local, in /tmp beside the unpacked call outputs (b1 = call 1, b2 = call 2, b3 = call 3): derive.py, which
# wrote fsdp2-one-rank.json and cpu-speed.json
#   # Local derivation of the record's two JSON files from what the three device calls brought back (run from /tmp).
#   import json, glob, statistics as st, sys
#   sys.path.insert(0, "/work/main")
#   from lab.cpu_speed import per_second, summary
#   REC = "/work/main/benchmarks/results/2026-11-29-fsdp2-host-speed-h200"
#   CMD1 = "torchrun --standalone --nproc_per_node 1 train_h100.py --preset 1.3b --batch_size 4 --max_steps 62 --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp (device-commands.sh, call 1)"
#   CMD2 = "taskset -c 0-14 torchrun --standalone --nproc_per_node 1 train_h100.py --preset 1.3b --batch_size 4 --max_steps 102 --eval_every 0 --checkpoint_every 0 --no_gradient_checkpointing --attention sdpa --parallel fsdp --fsdp_blocks_per_unit K (device-commands.sh, call 2)"
#   runs = []
#   arms1 = dict(cold_free=("free", "empty"), cold_bound=("loop and autograd threads on CPU 0", "empty"),
#                warm_free=("free", "warm"), warm_bound=("loop and autograd threads on CPU 0", "warm"),
#                warm_free2=("free", "warm"))
#   for i, arm in enumerate(["cold-free", "cold-bound", "warm-free", "warm-bound", "warm-free2"]):
#       r = json.load(open(f"b1/x1/{arm}/result.json"))
#       binding, caches = arms1[arm.replace("-", "_")]
#       runs.append(dict(call=1, order=i + 1, arm=arm, thread_binding=binding, compile_caches=caches, command=CMD1, **r))
#   runs.append(dict(call=1, order=6, arm="warm-bound2", status="error", thread_binding="loop and autograd threads on CPU 0",
#                    compile_caches="warm", command=CMD1, error="not run: the call's 600 s limit ended it as it started",
#                    preset="1.3b", precision="fp8-fused-delayed", world_size=1, parallel="fsdp"))
#   side = json.load(open("b2/u/side.json"))
#   speed = dict(runs=[dict(cpu=15, samples=side["probe"], grew=side["metrics_lines"])])
#   def windows(run, r):
#       lines = [(t, n) for t, p, n in side["metrics_lines"] if p.split("/")[-2] == run]
#       starts = [s for s, _ in side["probe"]]
#       import bisect
#       untimed = r["steps"] - len(r["step_ms"]); out = []
#       for (t0, n0), (t1, n1) in zip(lines, lines[1:]):
#           first, last = 10 * n0 - untimed, min(10 * n1, r["steps"]) - untimed
#           if first < 0:
#               continue
#           inside = [ms for _, ms in side["probe"][bisect.bisect_left(starts, t0):bisect.bisect_left(starts, t1)]]
#           out.append(dict(steps=f"{10 * n0 + 1}-{min(10 * n1, r['steps'])}", step_ms=round(st.median(r["step_ms"][first:last]), 2),
#                           host_ms=round(st.median(r["host_ms"][0][first:last]), 2), cpu15_probe_ms=round(st.median(inside), 4)))
#       return out
#   aligned = {}
#   for i, arm in enumerate(["bpu2-a", "bpu4-a", "bpu2-b", "bpu4-b"]):
#       r = json.load(open(f"b2/u/{arm}/result.json"))
#       runs.append(dict(call=2, order=i + 1, arm=arm, thread_binding="free (CPUs 0-14)", compile_caches="empty" if i == 0 else "warm",
#                        command=CMD2.replace(" K ", f" {r['fsdp_blocks_per_unit']} "), **r))
#       aligned[arm] = windows(arm, r)
#   t0 = side["probe"][0][0]
#   phases = {}
#   probes3 = {p: json.load(open(p)) for p in glob.glob("b3/c/*.json")}
#   FAST = min(summary(dict(cpu=0, samples=d["probe"]))["p10_ms"] for d in probes3.values())  # the fastest CPU's tenth
#   for p, d in probes3.items():
#       name, cpu = p.split("/")[-1][:-5].rsplit("-", 1)
#       run = dict(cpu=int(cpu), samples=d["probe"])
#       phases.setdefault(name, []).append(dict(**summary(run, FAST), per_second=[b["median_ms"] for b in per_second(d["probe"])]))
#   rec = dict(gpu="NVIDIA H200 (nvidia-h200: 1 GPU, 16 vCPUs, KVM guest, 1 thread per core, 1 NUMA node); calls 1 and 2 on two machines of that kind",
#              torch="2.11.0+cu130", torchao="0.18.0", triton="3.6.0", code="main at bb7fefc",
#              command="bash .ab/bind1.sh (call 1), bash .ab/units.sh (call 2): device-commands.sh", runs=runs)
#   json.dump(rec, open(f"{REC}/fsdp2-one-rank.json", "w"), indent=1)
#   order = ["one15-a", "all16", "low8", "even8", "one15-b", "one0"]
#   what = {"one15-a": "CPU 15 alone, 15 s", "all16": "all 16 CPUs at once, 15 s", "low8": "CPUs 0-7 at once, 15 s",
#           "even8": "the even CPUs at once, 15 s", "one15-b": "CPU 15 alone again, 30 s", "one0": "CPU 0 alone, 30 s"}
#   cpu_speed = dict(
#       gpu="nvidia-h200 machines (16 vCPUs, KVM guest); no GPU work in call 3",
#       work_unit="a dict of 5000 ints to str built and summed (lab/cpu_speed.py work_unit; side.py in device-commands.sh), timed back to back by a process bound to one CPU",
#       slow_share="share of samples over 1.5 times fast_ms",
#       fast_ms=FAST,
#       fast_ms_is="the fastest tenth's work unit of the fastest CPU probed in call 3",
#       call3_cpu_use="each phase's guest-wide CPU time from /proc/stat equals its probes' (user and system: about 1 CPU for one probe, 8 for eight, 16 for sixteen) and steal time stayed under 0.3 s: nothing else in the guest used CPU, and no vCPU was descheduled",
#       call2_beside_training=dict(where="CPU 15, alone (the training runs were limited to CPUs 0-14), through call 2's four runs",
#                                  summary=summary(speed["runs"][0], FAST),
#                                  per_second_median_ms=[b["median_ms"] for b in per_second(side["probe"])],
#                                  run_windows={arm: dict(started_s=round(min(t for t, p, n in side["metrics_lines"] if p.split("/")[-2] == arm) - t0, 1),
#                                                         windows=aligned[arm]) for arm in aligned}),
#       call3_phases=[dict(phase=k, what=what[k], cpus=sorted(phases[k], key=lambda x: x["cpu"])) for k in order])
#   json.dump(cpu_speed, open(f"{REC}/cpu-speed.json", "w"), indent=1)
#   for k in order:
#       rows = sorted(phases[k], key=lambda x: x["cpu"])
#       print(k, "median of medians", st.median(r["median_ms"] for r in rows), "slow share median", st.median(r["slow_share"] for r in rows), [(r["cpu"], r["median_ms"], r["slow_share"]) for r in rows])
#   print(summary(speed["runs"][0]))
#   for arm, w in aligned.items():
#       print(arm, [(x["steps"], x["step_ms"], x["cpu15_probe_ms"]) for x in w])
