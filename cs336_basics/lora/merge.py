"""Fold a LoRA run's adapters into its base: a plain model (the program: cs336_basics/programs/merge_lora.py).

W' = W + (alpha / r) B A for every layer with adapters, computed in float32 and stored in the base weights' dtype.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cs336_basics.config import RunConfig, lora_target_list
from cs336_basics.errors import ConfigError
from cs336_basics.lora.apply import apply_lora
from cs336_basics.lora.base import Base, load_base
from cs336_basics.lora.layers import FrozenLinear
from cs336_basics.model import TransformerLM
from cs336_basics.training.checkpoint import checkpoint_file, load_model_state, read_checkpoint


def lora_model(run_checkpoint: str | Path, base: str | Path | None = None) -> tuple[TransformerLM, RunConfig, Base]:
    """The fine-tuned model of a LoRA run's checkpoint, unmerged (base + adapters, BF16 base GEMMs), on the CPU in
    float32 (the base's weights and the adapters converted exactly), the run's config and its base. The base is the
    one the run recorded (--init_from), or `base` where it has moved since: either way its weights must be those the
    adapters were trained on (the SHA-256 the run recorded)."""
    path = Path(run_checkpoint)
    ckpt = read_checkpoint(checkpoint_file(path))
    config = RunConfig.from_dict(ckpt["config"])
    if not config.finetune.lora:
        raise ConfigError(f"{path} is not a LoRA run's checkpoint (no --lora_rank): it holds the whole model already.")
    recorded = config.finetune.init_from
    if base is None and not Path(recorded).expanduser().exists():
        raise ConfigError(
            f"{path}: the base this LoRA run fine-tunes, {recorded} (its --init_from), is no longer there. Pass --base "
            "with where it is now; its weights are checked against the ones the run started on."
        )
    model = TransformerLM(config.model)
    read, _ = load_base(model, str(base if base is not None else recorded), config.finetune.base_sha256)
    apply_lora(model, config.finetune, fp8=None)
    load_model_state(model, ckpt["model"], ckpt["path"])
    return model.eval(), config, read


@torch.no_grad()
def merge_adapters(model: nn.Module) -> nn.Module:
    """`model` with every FrozenLinear replaced by a plain nn.Linear holding its merged weight (in place)."""
    for fqn, layer in [(n, m) for n, m in model.named_modules() if isinstance(m, FrozenLinear)]:
        linear = nn.Linear(layer.in_features, layer.out_features, bias=False, device=layer.weight.device)
        linear.weight = nn.Parameter(layer.merged_weight(), requires_grad=False)
        parent, _, child = fqn.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, linear)
    return model


def merged_state_dict(run_checkpoint: str | Path, base: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The course-layout state dict of a LoRA run's fine-tuned model, adapters folded in, in its base's dtype (`base`:
    lora_model's). A base whose lm_head shares the embedding's weight keeps it shared where no adapter changed the
    head: both names hold one tensor, which torch.save stores once and base.shape_of_state reads as tied embeddings.
    An adapter on a tied head gives the head its own merged weight: the merged model is untied."""
    model, config, read = lora_model(run_checkpoint, base)
    dtype = read.state["token_embeddings.weight"].dtype
    state = {k: v.to(dtype) for k, v in merge_adapters(model).state_dict().items()}
    if config.model.tie_embeddings and "lm_head" not in lora_target_list(config.finetune.lora_targets):
        state["lm_head.weight"] = state["token_embeddings.weight"]
    return state


if __name__ == "__main__":  # the command's old home: say where it went rather than do nothing
    import sys

    moved = "python -m cs336_basics.programs.merge_lora RUN --output FILE"
    print(f"error: the merge program moved: {moved}", file=sys.stderr)
    sys.exit(2)
