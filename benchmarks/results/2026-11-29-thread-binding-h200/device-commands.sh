# The device commands behind this record, verbatim but for the shared set-up line
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# (torchao 0.18.0's wheel carried in .whl), torch 2.11.0+cu130, triton 3.6.0. Five nvidia-h200 requests, one machine
# (1 x H200, 16 vCPUs under KVM, 1 thread per core, 1 NUMA node: logs call1/facts.txt), main at a132409 plus, for
# calls 4 and 5 only, the prototype below. The scripts ran from .ab/ (not kept in the repository); their text is here.
# lab/thread_binding.py is their cleaned-up form (the probe without the migrations and steal columns, which stayed 0),
# written after these runs and not itself run on a GPU.

# ---- call 1 (cold machine): machine facts; a busy Python process on each other CPU; the training loop's GPU tests
(lscpu; lscpu -e; nproc; cat /sys/fs/cgroup/cpu.max; cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list; which numactl; nvidia-smi topo -m) > $OUT/facts.txt 2>&1
timeout 150 python3 .ab/smt_probe.py 2>&1 | tee $OUT/smt.log | tail -20
timeout -k 5 300 python3 -m pytest -m gpu -p no:cacheprovider -q tests/test_train_cli.py > $OUT/train_cli.log 2>&1; tail -3 $OUT/train_cli.log

# ---- call 2: the probe for 40 s with the process on CPU 0, then 40 s free (an earlier host_drift.py: argv "pin" or
# "free", no migrations column)
timeout 80 python3 .ab/host_drift.py pin 40 2>&1 | tail -30; timeout 80 python3 .ab/host_drift.py free 40 2>&1 | tail -8

# ---- call 3: 12 s each, in this order
for s in free 0 7 15 0-1 0-3 0-7 late free; do timeout 40 python3 .ab/host_drift.py $s 12 2>&1 | grep -v "^{'t'" | tail -3; done

# ---- call 4 (cut by the request's 590 s limit; each sweep's own 200 s cut its FP8 run: BF16 rows only)
bash .ab/cmdA.sh
# ---- call 5
bash .ab/cmdB.sh

# ======== .ab/smt_probe.py
# """Does another busy thread on CPU j slow a host-bound eager training step pinned to CPU c0? (one GPU)"""
# import json, os, statistics, subprocess, sys, time
# import torch
# from cs336_basics.build import new_model
# from cs336_basics.config import ModelConfig
# 
# cpus = sorted(os.sched_getaffinity(0))
# c0 = cpus[0]
# os.sched_setaffinity(0, {c0})
# torch.set_num_threads(1)
# cfg = ModelConfig(vocab_size=512, context_length=64, dim=256, n_layers=6, n_heads=4, intermediate_size=512)
# model = new_model(cfg, device="cuda", dtype=torch.bfloat16)
# opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
# x = torch.randint(0, 512, (2, 64), device="cuda")
# 
# def step():
#     loss = model(x).float().logsumexp(-1).mean()
#     loss.backward()
#     opt.step(); opt.zero_grad(set_to_none=True)
# 
# def measure(n=40):
#     for _ in range(5): step()
#     torch.cuda.synchronize()
#     ts = []
#     for _ in range(n):
#         t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t) * 1e3)
#     return statistics.median(ts)
# 
# HOG = "import os,sys; os.sched_setaffinity(0,{int(sys.argv[1])})\nwhile True:\n d={i:str(i) for i in range(200)}; s=sum(len(v) for v in d.values())"
# out = {"cpus": cpus, "c0": c0, "alone": [measure()]}
# for j in cpus[1:]:
#     hog = subprocess.Popen([sys.executable, "-c", HOG, str(j)])
#     time.sleep(0.3)
#     out[f"hog_on_{j}"] = measure()
#     hog.kill(); hog.wait()
# out["alone"].append(measure())
# base = statistics.median(out["alone"])
# for k, v in out.items():
#     if k.startswith("hog"):
#         print(f"{k:10s} {v:7.2f} ms  {v/base:5.3f}x")
# print("alone", out["alone"])
# json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "smt_probe.json"), "w"), indent=1)
#
# ======== .ab/host_drift.py
# """Does this machine's host speed drift with nothing else running? A host-bound eager GPU step and a pure-Python
# loop, timed in turn for ~N seconds, with the guest's steal time from /proc/stat per interval. Pinned or not (argv[1])."""
# import json, os, statistics, sys, time
# import torch
# from cs336_basics.build import new_model
# from cs336_basics.config import ModelConfig
# 
# spec = sys.argv[1]  # "free", "late" (pin loop+autograd threads after warm-up), or a CPU list "0-3" / "5"
# pin = spec
# seconds = float(sys.argv[2])
# def cpus_of(spec):
#     a, _, b = spec.partition("-")
#     return set(range(int(a), int(b or a) + 1))
# if spec not in ("free", "late"):
#     os.sched_setaffinity(0, cpus_of(spec))
# torch.set_num_threads(1)
# cfg = ModelConfig(vocab_size=512, context_length=64, dim=256, n_layers=6, n_heads=4, intermediate_size=512)
# model = new_model(cfg, device="cuda", dtype=torch.bfloat16)
# opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
# x = torch.randint(0, 512, (2, 64), device="cuda")
# 
# def step():
#     model(x).float().logsumexp(-1).mean().backward()
#     opt.step(); opt.zero_grad(set_to_none=True)
# 
# def cpu_work():
#     d = {i: str(i) for i in range(20000)}
#     return sum(len(v) for v in d.values())
# 
# def steal():
#     f = open("/proc/stat").readline().split()
#     return int(f[8])  # jiffies
# 
# for _ in range(10): step()
# torch.cuda.synchronize()
# if spec == "late":
#     names = {t: open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")}
#     hot = [int(t) for t, n in names.items() if int(t) == os.getpid() or n.startswith("pt_autograd")]
#     print("threads:", sorted(set(names.values())), "pinning", hot)
#     for t in hot:
#         os.sched_setaffinity(t, {2})
# def migrations():
#     for line in open("/proc/self/sched"):
#         if line.startswith("se.nr_migrations"):
#             return int(line.split()[-1])
#     return -1
# rows, t_end = [], time.perf_counter() + seconds
# while time.perf_counter() < t_end:
#     s0, c0, m0 = steal(), time.process_time(), migrations()
#     ts = []
#     for _ in range(20):
#         t = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t) * 1e3)
#     cpu = (time.process_time() - c0) / 20 * 1e3
#     t = time.perf_counter()
#     for _ in range(10): cpu_work()
#     py = (time.perf_counter() - t) * 100
#     rows.append(dict(t=round(time.perf_counter() - t_end + seconds, 2), step_ms=round(statistics.median(ts), 2),
#                      cpu_ms_per_step=round(cpu, 2), py_ms=round(py, 2), steal_jiffies=steal() - s0, migrations=migrations() - m0))
# for r in rows[:: max(1, len(rows) // 4)]:
#     print(r)
# st = [r["step_ms"] for r in rows]; py = [r["py_ms"] for r in rows]
# print(f"pin={pin} intervals={len(rows)} step median {statistics.median(st):.2f} min {min(st):.2f} max {max(st):.2f};"
#       f" python loop median {statistics.median(py):.2f} min {min(py):.2f} max {max(py):.2f}; steal total {sum(r['steal_jiffies'] for r in rows)}")
# json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), f"host_drift_{sys.argv[1]}.json"), "w"), indent=0)
#
# ======== .ab/cmdA.sh
# S="--presets 366m --precisions bf16,fp8 --attention sdpa --ac off --steps 20 --cold"
# i=0
# for b in 0 1 0 1; do i=$((i+1)); CS336_BIND=$b timeout 200 python3 optimize_performance.py $S --compile default --out_dir $OUT/ng$i-bind$b > $OUT/ng$i.log 2>&1; grep -h "bound step" $OUT/ng$i.log | head -1; done
# for b in 0 1; do CS336_BIND=$b timeout 200 python3 optimize_performance.py $S --compile auto --gradient_accumulation_steps 4 --out_dir $OUT/acc-bind$b > $OUT/acc$b.log 2>&1; done
# python3 - <<'PY'
# import json,glob,os
# for f in sorted(glob.glob(os.environ["OUT"]+"/*/sweep.json")):
#     for r in json.load(open(f))["runs"]:
#         import statistics as st
#         hm, sm = r.get("host_ms"), r.get("step_ms")
#         h = round(st.median(hm[0]), 2) if hm else None
#         s = round(st.median(sm), 2) if sm else None
#         print(f.split("/")[-2], r["precision"], r.get("fp8_path"), r["status"], r["tokens_per_sec"], "step", s, "host", h)
# PY
# cd $OUT && tar cf all.tar ng* acc* && rm -rf ng*-bind* acc-bind*
#
# ======== .ab/cmdB.sh
# S="--presets 366m --precisions fp8 --attention sdpa --ac off --steps 30 --compile default"
# i=0
# for b in 0 1 0 1; do i=$((i+1)); CS336_BIND=$b timeout 240 python3 optimize_performance.py $S --out_dir $OUT/f$i-bind$b > $OUT/f$i.log 2>&1; echo "bind=$b"; grep -h "ok .*tokens/s" $OUT/f$i.log; python3 -c "
# import json,statistics as st
# for r in json.load(open('$OUT/f$i-bind$b/sweep.json'))['runs']:
#     print(' step', st.median(r['step_ms']), 'host', [st.median(h) for h in r['host_ms']], 'cpu', [st.median(h) for h in r['host_cpu_ms']])
# " 2>&1 | tail -1; grep -rh "bound step" $OUT/f$i-bind$b/logs | head -1; done
# cd $OUT && tar cf fp8.tar f* && rm -rf f*-bind* f?.log
#
# ======== the prototype behind CS336_BIND=1 (calls 4 and 5; reverted after them), in cs336_basics/training/trainer.py:
#  import os
#  def _bind_step_threads(world) -> None:  # PROTOTYPE
#      cpus = sorted(os.sched_getaffinity(0))
#      local_rank = int(os.environ.get("LOCAL_RANK", 0)); local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
#      cpu = cpus[local_rank * len(cpus) // local_world]
#      os.sched_setaffinity(0, {cpu})
#      for tid in os.listdir("/proc/self/task"):
#          with open(f"/proc/self/task/{tid}/comm") as f:
#              if f.read().startswith("pt_autograd"):
#                  os.sched_setaffinity(int(tid), {cpu})
#      print(f"bound step threads to CPU {cpu}", flush=True)
#  ... and in Trainer._timed_step, after the first step's compile wait:
#          if self.step == progress.first_step and os.environ.get("CS336_BIND") == "1":
#              _bind_step_threads(self.world)
