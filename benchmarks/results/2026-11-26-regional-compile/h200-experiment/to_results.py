"""results.json (the shared schema) from this folder's logs: python to_results.py (on the CPU, after the GPU run)."""

import json
from pathlib import Path

from cs336_basics.files.atomic import write_json_atomic

HERE = Path(__file__).parent
SHAPES = {  # experiment.py's shapes
    "366m": dict(dim=896, n_layers=24, n_heads=14, d_ff=3584, vocab_size=32000, batch_size=8, seq_len=2048),
    "gpt2-small": dict(dim=768, n_layers=12, n_heads=12, d_ff=3072, vocab_size=50304, batch_size=16, seq_len=1024),
}


def main() -> None:
    runs = []
    for log in sorted(HERE.glob("*.log")):
        line = next(line for line in log.read_text().splitlines() if line.startswith("RESULT "))
        r = json.loads(line.removeprefix("RESULT "))
        fp8 = r["precision"] == "fp8"
        runs.append(
            dict(
                preset=r["preset"],
                **SHAPES[r["preset"]],
                precision="fp8-tensorwise" if fp8 else "bf16",
                compile=r["mode"],
                compile_scope="model" if r["scope"] == "whole" else "blocks",
                attention="sdpa",
                tokens_per_sec=r["tok_s"],
                step_ms=r["step_ms"],
                mfu=None,
                peak_mem_gib=r["peak_gib"],
                compile_s=r["compile_s"],
                loss=r["loss"][-1],
                status="ok",
                world_size=1,
                parallel="none",
                gradient_checkpointing=False,
                fp8_shape_filter=False if fp8 else None,
                fp8_lm_head=fp8,
                fp8_path="fused" if fp8 else None,
                fp8_scaling="delayed" if fp8 else None,
                log=log.name,
            )  # fmt: skip
        )
    command = (
        "python3 experiment.py PRECISION SCOPE MODE PRESET, a fresh process with empty compile caches each (README)"
    )
    header = dict(gpu="NVIDIA H200", torch="2.11.0+cu130", torchao="0.18.0", command=command)
    write_json_atomic(HERE / "results.json", {**header, "runs": runs})


if __name__ == "__main__":
    main()
