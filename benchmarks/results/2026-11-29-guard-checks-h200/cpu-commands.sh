# CPU probes behind this record: a 2-core AMD EPYC box with no GPU, torch 2.11.0+cu130 as the lock installs,
# main at 7294185.
# Run from the repository root: `bash benchmarks/results/2026-11-29-guard-checks-h200/cpu-commands.sh OUT.json`.
# (1) One compiled block of a tiny TransformerLM (dim 32, 2 heads, seq 16, batch 2; backend "eager", fullgraph),
#     BF16 and the fused FP8 path (CPU emulation) with delayed and dynamic scaling, after 3 training steps: the
#     time of its guard check called directly (the cache entry's guard_manager.check, 2,000 calls), and the
#     profiler's "TorchDynamo Cache Lookup" self time per call over 10 steps of the two blocks.
#     Then the same two blocks' forward timed in-process (no_grad, 500 calls, 2 rounds each) with dynamo's guard
#     checks and without them, in turns (torch.compiler.set_stance(skip_guard_eval_unsafe=True)): what they
#     cost a real call.
# (2) The AOTAutograd + inductor cost of graph inputs like delayed scaling's buffers: a tiny compiled module with N
#     buffers, each mutated in its forward (as a site's amax rows are), its forward + backward per call (2,000 calls).
uv run python - "$1" <<'PY'
import json, sys, time
import torch
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.profiler import ProfilerActivity, profile

from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.model.transformer import TransformerLM
from cs336_basics.precision.fused.convert import FusedFP8

runs = []
for scaling in ("bf16", "delayed", "dynamic"):
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=64, context_length=16, dim=32, n_layers=2, n_heads=2, intermediate_size=64)
    model = TransformerLM(config).to(torch.bfloat16)
    update = lambda: None  # noqa: E731
    if scaling != "bf16":
        converter = FusedFP8(FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_scaling=scaling))
        converter.convert(model)
        if getattr(converter, "scaling", None) is not None:
            converter.scaling.set_step_tokens(32, 1)
            update = converter.scaling.update
    for block in model.layers:
        block.forward = torch.compile(block.forward, backend="eager", fullgraph=True)
    x = torch.randn(2, 16, config.dim, dtype=torch.bfloat16, requires_grad=True)

    def step():
        h = x
        for block in model.layers:
            h = block(h)
        h.float().sum().backward()
        update()

    for _ in range(3):
        step()
    (entry,) = _debug_get_cache_entry_list(type(model.layers[0]).forward.__code__)
    frame_locals = {"self": model.layers[0], "x": x}
    assert entry.guard_manager.check(frame_locals)
    start = time.perf_counter()
    for _ in range(2000):
        entry.guard_manager.check(frame_locals)
    check_us = (time.perf_counter() - start) / 2000 * 1e6
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    (lookup,) = [e for e in prof.key_averages() if e.key == "TorchDynamo Cache Lookup"]

    def forward_us(skip: bool) -> float:
        with torch.no_grad(), torch.compiler.set_stance(skip_guard_eval_unsafe=skip):
            start = time.perf_counter()
            for _ in range(500):
                h = x
                for block in model.layers:
                    h = block(h)
        return (time.perf_counter() - start) / 500 / len(model.layers) * 1e6

    forward_us(False)  # no_grad is another graph to dynamo: compiled here, before the timed rounds
    rounds = {False: [], True: []}
    for skip in (False, True, False, True):
        rounds[skip].append(forward_us(skip))
    runs.append({"probe": "block guards", "precision": scaling, "guard_check_us": round(check_us, 2),
                 "profiled_cache_lookup_self_us": round(lookup.self_cpu_time_total / lookup.count, 1),
                 "block_forward_us_with_guards": [round(v, 1) for v in rounds[False]],
                 "block_forward_us_guards_skipped": [round(v, 1) for v in rounds[True]]})
    print(runs[-1])


class Buffers(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        for i in range(n):
            self.register_buffer(f"b{i}", torch.zeros(4))
        self.n = n

    def forward(self, x):
        y = x @ self.weight
        for i in range(self.n):
            buffer = self._buffers[f"b{i}"]
            buffer.copy_(torch.maximum(buffer, y[:4, 0].detach()))
        return y


for n in (0, 20, 70):
    torch._dynamo.reset()
    fn = torch.compile(Buffers(n).forward, fullgraph=True)
    x = torch.randn(8, 8, requires_grad=True)
    for _ in range(5):
        fn(x).sum().backward()
    start = time.perf_counter()
    for _ in range(2000):
        fn(x).sum().backward()
    runs.append({"probe": "mutated buffer inputs", "buffers": n,
                 "forward_backward_us": round((time.perf_counter() - start) / 2000 * 1e6, 1)})
    print(runs[-1])
json.dump({"torch": torch.__version__, "machine": "CPU, 2 cores", "runs": runs}, open(sys.argv[1], "w"), indent=1)
PY
