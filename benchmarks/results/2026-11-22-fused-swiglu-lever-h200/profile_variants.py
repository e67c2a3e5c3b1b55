"""Exploration script (kept with its results): per variant, train N steps, time 10, profile 1; list top kernels."""

import collections
import json
import statistics

import torch

from cs336_basics.build import build, plan
from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.data import prepare_data
from cs336_basics.timing import time_calls_ms
from cs336_basics.training.measure import train_for_measurement


def main():
    parser = config_parser(None)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    config = config_from_args(args).replace(train={"max_steps": 12, "log_every": 12})
    p = plan(config)
    data = prepare_data(p.config.data, p.config.model.vocab_size)
    built = build(p)
    trainer, result = train_for_measurement(
        built.model, built.config, data.train, data.val, built.device, log=lambda m: None
    )
    ms = statistics.median(time_calls_ms(trainer.train_step, 10))
    tokens = built.config.train.batch_size * built.config.model.context_length
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        trainer.train_step()
        torch.cuda.synchronize()
    kern = collections.Counter()
    count = collections.Counter()
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and not getattr(
            e, "is_user_annotation", False
        ):
            kern[e.name] += e.time_range.end - e.time_range.start
            count[e.name] += 1
    total = sum(kern.values()) / 1e3
    rec = {
        "tag": args.tag,
        "step_ms": ms,
        "tokens_per_sec": tokens / ms * 1e3,
        "kernel_ms": total,
        "n_kernels": sum(count.values()),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "compile_s": result.compile_s,
        "loss": result.loss,
        "fp8": built.fp8_line,
        "top": [(n[:120], round(us / 1e3, 3), count[n]) for n, us in kern.most_common(40)],
    }
    with open(args.json, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(
        f"{args.tag:28s} step {ms:7.2f} ms  {rec['tokens_per_sec']:9,.0f} tok/s  kernels {total:6.2f} ms "
        f"({rec['n_kernels']})  peak {rec['peak_gib']:.2f} GiB  compile {result.compile_s:.0f}s"
        f"  loss {result.loss:.4f}",
        flush=True,
    )


main()
