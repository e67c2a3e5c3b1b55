"""LoRA fine-tuning on a frozen base (BF16 or FP8): the layer's numerics and what it must not compute, the model
wiring, adapter-only checkpoints, exact resume, merging, and the errors. CPU; FP8 GEMMs run through torch._scaled_mm
on the CPU (the same calls as on a GPU)."""

from __future__ import annotations

import pytest
import torch
from numerics import sqnr_db
from tiny import TINY_FLAGS, tiny_model
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import train_h100
from cs336_basics.config import FinetuneConfig, FP8Config, build_config
from cs336_basics.errors import ConfigError
from cs336_basics.lora import apply_lora
from cs336_basics.lora.layers import FrozenLinear
from cs336_basics.lora.merge import lora_model, merge_adapters, merged_state_dict
from cs336_basics.model import TransformerLM
from cs336_basics.training.checkpoint import read_checkpoint
from cs336_basics.training.metrics import read_metrics

FP8 = FP8Config(use_fp8=True, fp8_emulate=True)


def tiny_lm(seed: int = 0, dtype=torch.float32) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(tiny_model()).to(dtype)


def batch(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(seed))


class CountScaledMM(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops.aten._scaled_mm.default
        return func(*args, **(kwargs or {}))


# ---- the layer ----


def test_with_b_zero_the_lora_model_is_the_base_exactly():
    base, tuned = tiny_lm(), tiny_lm()
    apply_lora(tuned, FinetuneConfig(init_from="x", lora_rank=4, lora_targets="all,lm_head"), fp8=None)
    x = batch()
    assert torch.equal(base(x), tuned(x))


def test_only_the_adapters_get_gradients():
    model = tiny_lm()
    report = apply_lora(model, FinetuneConfig(init_from="x", lora_rank=4, lora_targets="attn"), fp8=None)
    model(batch(), targets=batch(2)).backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained == {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.endswith(("lora_a", "lora_b")) for n in trained)
    assert len(report.adapter_layers) == 2 * 4 and report.trainable == sum(
        p.numel() for n, p in model.named_parameters() if n.endswith(("lora_a", "lora_b"))
    )


def test_fp8_base_casts_its_weight_once_and_runs_two_gemms_not_three():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    layer = FrozenLinear(linear, fp8=True, rank=4)
    x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    with CountScaledMM() as counter:
        for _ in range(3):
            layer(x).float().square().sum().backward()
    assert layer.weight_casts == 1  # built once, never per step
    assert counter.calls == 3 * 2  # forward and the input's gradient; no weight-gradient GEMM
    assert layer.weight.grad is None and layer.lora_a.grad is not None


def test_fp8_base_matches_the_bf16_base():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    fp8, bf16 = FrozenLinear(linear, fp8=True), FrozenLinear(linear, fp8=False)
    dy = torch.randn(32, 48, dtype=torch.bfloat16)
    y8, y16 = fp8(xs[0]), bf16(xs[1])
    (y8 * dy).sum().backward()
    (y16 * dy).sum().backward()
    # E4M3 has 3 mantissa bits (SQNR ~ 25-30 dB per operand); E5M2 gradients 2 bits.
    assert sqnr_db(y16.float(), y8.float()) > 20
    assert sqnr_db(xs[1].grad.float(), xs[0].grad.float()) > 15


def test_merged_weights_give_the_unmerged_outputs():
    model = tiny_lm()
    apply_lora(model, FinetuneConfig(init_from="x", lora_rank=4, lora_alpha=8, lora_targets="all"), fp8=None)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(0, 0.1)  # trained adapters: B no longer 0
    model.eval()
    x = batch()
    unmerged = model(x)
    merged = merge_adapters(model)(x)
    assert not any(isinstance(m, FrozenLinear) for m in model.modules())
    torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)


# ---- errors ----


def test_targets_and_ranks_are_checked():
    with pytest.raises(ConfigError, match="not a layer of this model"):
        FinetuneConfig(init_from="x", lora_rank=4, lora_targets="attn,qkv")
    with pytest.raises(ConfigError, match="lora_rank"):
        FinetuneConfig(init_from="x", lora_rank=0)
    with pytest.raises(ConfigError, match="lora_rank"):
        FinetuneConfig(init_from="x", lora_rank=-2)
    with pytest.raises(ConfigError, match="--init_from"):
        FinetuneConfig(lora_rank=4)


def test_fp8_settings_the_frozen_base_cannot_honour_are_refused():
    from cs336_basics.config import RunConfig, TrainConfig
    from cs336_basics.lora import check_finetune_request
    from cs336_basics.parallel.world import World

    lora = RunConfig(finetune=FinetuneConfig(init_from="x", lora_rank=2), train=TrainConfig(device="cuda"))
    for fp8, match in (
        ({"use_fp8": True, "fp8_path": "fused"}, "Drop --fp8_path"),
        ({"use_fp8": True, "fp8_emulate": True}, "Drop --fp8_emulate"),
        ({"use_fp8": True, "fp8_recipe": "rowwise"}, "tensorwise"),
    ):
        with pytest.raises(ConfigError, match=match):
            check_finetune_request(lora.replace(fp8=fp8), World())
    with pytest.raises(ConfigError, match="one GPU only"):
        check_finetune_request(lora, World(world_size=2, launched=True))
    check_finetune_request(lora.replace(fp8={"use_fp8": True}), World())  # the plain request passes


def test_fp8_with_no_layer_to_convert_is_an_error():
    model = tiny_lm(dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match="no frozen base linear passes the FP8 filters"):
        apply_lora(model, FinetuneConfig(init_from="x", lora_rank=2), FP8Config(use_fp8=True, fp8_shape_filter=True))


# ---- the whole job: pretrain, fine-tune, resume, merge ----


def run(argv, capsys) -> tuple[int, str, str]:
    code = train_h100.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def base_run(tmp_path, token_files, capsys):
    out = tmp_path / "base"
    assert run([*TINY_FLAGS, *token_files, "--max_steps", "6", "--out_dir", out], capsys)[0] == 0
    return out


COMMON = ["--device", "cpu", "--batch_size", "4", "--warmup_steps", "2", "--log_every", "1", "--eval_every", "0"]


def test_lora_fine_tune_resumes_exactly_and_saves_adapters_alone(base_run, tmp_path, token_files, capsys):
    lora = [*COMMON, *token_files, "--init_from", base_run, "--lora_rank", "4", "--lora_targets", "attn,w2"]
    lora += ["--lr", "1e-2", "--lr_decay_steps", "8", "--lora_dropout", "0.1"]
    lora += ["--dtype", "bfloat16", "--use_fp8", "--fp8_emulate"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    code, stdout, err = run([*lora, "--max_steps", "8", "--out_dir", whole], capsys)
    assert code == 0, err
    assert "rank 4, scale 1, adapters on q+k+v+o+w2: 10 layers" in stdout
    assert "14 frozen linears in FP8 (weights cast once), 1 in BF16" in stdout and "no weight-gradient GEMM" in stdout
    assert "14 FP8 linears counted" in stdout
    ckpt = read_checkpoint(whole / "checkpoint.pt")
    assert ckpt["model"] and all(k.endswith(("lora_a", "lora_b")) for k in ckpt["model"])  # adapters alone
    assert run([*lora, "--max_steps", "4", "--out_dir", split], capsys)[0] == 0
    code, _, err = run(["--resume", "--out_dir", split, "--max_steps", "8"], capsys)
    assert code == 0, err
    assert [r["loss"] for r in read_metrics(split / "metrics.jsonl")] == [
        r["loss"] for r in read_metrics(whole / "metrics.jsonl")
    ]
    assert all(t.abs().max() > 0 for k, t in ckpt["model"].items() if k.endswith("lora_b"))  # B left 0: trained


def test_merge_writes_a_plain_state_dict_with_the_fine_tuned_outputs(base_run, tmp_path, token_files, capsys):
    out = tmp_path / "lora"
    argv = [*COMMON, *token_files, "--init_from", base_run, "--lora_rank", "4", "--lora_targets", "all"]
    assert run([*argv, "--lr", "1e-2", "--max_steps", "4", "--out_dir", out], capsys)[0] == 0
    tuned, config = lora_model(out)
    plain = TransformerLM(config.model)
    plain.load_state_dict(merged_state_dict(out))  # strict: the course layout, no adapter keys
    x = batch()
    torch.testing.assert_close(plain.eval()(x), tuned(x), rtol=1e-5, atol=1e-5)


def test_the_shape_comes_from_the_base_and_a_clashing_flag_is_an_error(base_run, tmp_path, token_files, capsys):
    config = build_config({"finetune": {"init_from": str(base_run)}})  # the cpu-small preset's shape is larger
    assert config.model.dim == 32 and config.model.n_layers == 2
    argv = [*COMMON, *token_files, "--init_from", base_run, "--dim", "64", "--out_dir", tmp_path / "r"]
    code, stdout, err = run(argv, capsys)
    assert code == 2 and "--dim 64 (the base has 32)" in err and "FINAL CONFIGURATION SUMMARY" not in stdout


def test_a_lora_checkpoint_is_not_a_base(base_run, tmp_path, token_files, capsys):
    out = tmp_path / "lora"
    argv = [*COMMON, *token_files, "--init_from", base_run, "--lora_rank", "2", "--max_steps", "2"]
    assert run([*argv, "--out_dir", out], capsys)[0] == 0
    code, _, err = run([*COMMON, *token_files, "--init_from", out, "--out_dir", tmp_path / "again"], capsys)
    assert code == 2 and "Merge them into their base first" in err
