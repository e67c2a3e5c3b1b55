"""Two micro-batches per step through a model compiled with mode="reduce-overhead" (CUDA graphs), against the same
steps in eager mode: the check behind the refusal of CUDA graphs with gradient accumulation (build.py). GPU only.

    python3 cuda_graphs_accumulation_probe.py
"""

import copy

import torch

from cs336_basics.config import ModelConfig
from cs336_basics.model.transformer import TransformerLM


def accumulate(model: torch.nn.Module, batches: list[torch.Tensor]) -> None:
    for p in model.parameters():
        p.grad = None
    for batch in batches:
        (model(batch[:, :-1], batch[:, 1:]) / len(batches)).backward()


def main() -> None:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=512, context_length=64, dim=128, n_layers=2, n_heads=4, intermediate_size=512)
    eager = TransformerLM(config).cuda()
    graphed = copy.deepcopy(eager)
    compiled = torch.compile(graphed, mode="reduce-overhead")
    data = [torch.randint(0, 512, (4, 65), device="cuda") for _ in range(6)]
    try:
        for step in range(3):
            accumulate(eager, data[2 * step : 2 * step + 2])
            accumulate(compiled, data[2 * step : 2 * step + 2])
            pairs = zip(eager.parameters(), graphed.parameters(), strict=True)
            diff = max((a.grad - b.grad).abs().max().item() for a, b in pairs)
            print("step", step, "max grad diff", diff, flush=True)
    except RuntimeError as exc:
        print("FAILED:", type(exc).__name__, str(exc)[:300])


if __name__ == "__main__":
    main()
