"""Throughput accounting (FLOPs per token, MFU), the JSONL metrics log and the loss-curve plot."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from cs336_basics.config import ModelConfig
from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import atomic_write, write_text_atomic

# Dense BF16 tensor-core peak (no sparsity), FLOP/s, by GPU name fragment. H100 SXM and H200 share the same
# compute die, hence the same peak; FP8 runs are reported against this BF16 peak too, so MFU stays comparable.
BF16_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_flops(device: torch.device) -> float | None:
    """Dense BF16 peak for a known GPU; None where we do not know it (CPU, unlisted GPUs): MFU is then omitted."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_FLOPS.items() if key in name), None)


def attention_flops_per_token(n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token of attention's score and value matmuls: 12·L·d·T (the PaLM appendix-B convention)."""
    return 12.0 * n_layers * dim * seq_len


def flops_per_token(config: ModelConfig, non_embedding_params: int, frozen_params: int = 0) -> float:
    """Training FLOPs per token: 6N for the weight matmuls (forward + backward) plus attention's score and value
    matmuls (attention_flops_per_token). N excludes the token embedding (a lookup, no matmul) but includes the
    lm_head. Of N, `frozen_params` (a fine-tune's frozen base) cost 4 each, not 6: their backward computes the input's
    gradient only, never the weight's."""
    attention = attention_flops_per_token(config.n_layers, config.dim, config.context_length)
    return 6 * non_embedding_params - 2 * frozen_params + attention


def frozen_matmul_parameters(model: torch.nn.Module) -> int:
    """Frozen parameters of the model's matmuls (a LoRA base's linears): the embedding table is a lookup, not a
    matmul, unless the lm_head shares it."""
    tied = getattr(getattr(model, "config", None), "tie_embeddings", False)
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if not p.requires_grad and p.ndim >= 2 and (tied or not name.startswith("token_embeddings"))
    )


def mfu(tokens_per_sec: float, flops_per_tok: float, peak: float | None) -> float | None:
    return None if peak is None else tokens_per_sec * flops_per_tok / peak


def _no_follow(path: str, flags: int) -> int:
    # A metrics.jsonl that is a symbolic link fails to open (ELOOP) rather than truncating or creating its target.
    return os.open(path, flags | os.O_NOFOLLOW, 0o666)


class MetricsLog:
    """Appends one JSON object per log step and flushes it, so a crash loses nothing already logged."""

    def __init__(self, path: Path, resume_from_step: int | None = None):
        """A fresh log, or with resume_from_step the existing one cut back to that step: steps that ran after
        the checkpoint being resumed are run again, and must not appear twice. The cut is atomic, so a kill
        during it loses nothing."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_from_step]
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            self._file = open(self.path, "a", opener=_no_follow)  # noqa: SIM115 - open until close()
        else:
            self._file = open(self.path, "w", opener=_no_follow)  # noqa: SIM115 - open until close()
        self._failed = False

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        try:
            self._file.flush()
        except OSError:
            self._failed = True
            raise

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            # A failed write keeps its line buffered and close writes it again: the first error already says so
            # (and naming the file); this one would replace it with one that names nothing.
            if not self._failed:
                raise


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics log. A last line cut short (the process was killed while appending it) is
    left out; a damaged line anywhere else is an error."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                break
            raise ConfigError(f"{path} line {i + 1} is not valid JSON ({exc}); the metrics log is damaged.") from exc
    return records


def plot_loss_curve(metrics_path: Path, png_path: Path, title: str = "") -> Path:
    """Train loss (and validation loss where measured) against tokens seen."""
    import matplotlib

    matplotlib.use("Agg")  # headless: runs on servers and CI without a display
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    train = [(r["tokens"], r["loss"]) for r in records if r.get("loss") is not None and math.isfinite(r["loss"])]
    val = [(r["tokens"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss")
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss")
    ax.set_xlabel("tokens")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        atomic_write(png_path, lambda f: fig.savefig(f, format="png", dpi=120))
    finally:
        plt.close(fig)
    return Path(png_path)
