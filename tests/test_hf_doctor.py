"""The Hugging Face side of the FP8 doctor: a transformers causal LM built from a config behind our forward, and the
findings that need no GPU (which linears each policy converts, the FLOP share they put in FP8, each failure mode the
issue lists caught with its number). Skipped without transformers (the hf extra)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")

from cs336_basics.config import FP8Config  # noqa: E402
from cs336_basics.errors import ConfigError  # noqa: E402
from cs336_basics.hf import diagnosis  # noqa: E402
from cs336_basics.hf.diagnosis import diagnose, diagnose_causal_lm, policy_report, policy_share  # noqa: E402
from cs336_basics.hf.models import NAMED_SHAPES, build_causal_lm, hf_config  # noqa: E402
from cs336_basics.precision.fp8 import convert_model_to_fp8  # noqa: E402


def tiny(**overrides):
    return build_causal_lm(hf_config("llama-tiny", **overrides))


def causes(found) -> list[str]:
    return [f.cause for f in found.findings]


def test_configs_come_from_a_named_shape_or_a_local_directory(tmp_path):
    assert hf_config("llama-1b").hidden_size == NAMED_SHAPES["llama-1b"]["hidden_size"]
    assert hf_config("llama-tiny", num_hidden_layers=3).num_hidden_layers == 3
    hf_config("llama-tiny").save_pretrained(tmp_path)
    assert hf_config(str(tmp_path)).vocab_size == NAMED_SHAPES["llama-tiny"]["vocab_size"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        hf_config(str(tmp_path / "empty"))


def test_the_wrapped_model_is_called_like_ours():
    model = tiny()
    ids = torch.randint(0, model.vocab_size, (2, 16))
    targets = torch.roll(ids, -1, dims=1)
    logits = model(ids)
    assert logits.shape == (2, 16, model.vocab_size)
    torch.testing.assert_close(
        model(ids, targets=targets), F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    )
    embeddings = model.hf.get_input_embeddings().weight.numel()
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - embeddings


def test_the_accelerate_policy_is_accelerates_own_filter():
    ao = pytest.importorskip("accelerate.utils.ao")
    model = tiny()
    first, last = ao.find_first_last_linear_layers(model)
    theirs = [fqn for fqn, m in model.named_modules() if isinstance(m, nn.Linear)
              and ao.filter_linear_layers(m, fqn, layers_to_filter=[first, last])]  # fmt: skip
    report = policy_report(model, "accelerate")
    assert report.converted == theirs and set(report.skipped) == {first, last}
    assert first == "hf.model.layers.0.self_attn.q_proj" and last == "hf.lm_head"


def test_the_every_linear_policy_is_what_torchaos_conversion_converts():
    model = tiny()
    report = policy_report(model, "every-linear")
    converted = convert_model_to_fp8(model, FP8Config(use_fp8=True, fp8_emulate=True, fp8_lm_head=True))
    assert report.converted == converted.converted and len(report.converted) == 15


def test_flop_share_and_its_bound_follow_amdahls_law():
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False))
    every = policy_share(model, "every-linear", tokens=32, other_flops=0.0)
    assert every.fp8_flop_share == 1.0 and every.flop_bound_speedup == pytest.approx(2.0)
    first_and_last = policy_share(model, "accelerate", tokens=32, other_flops=0.0)
    assert first_and_last.report.n_converted == 0 and first_and_last.fp8_flop_share == 0.0
    linear_flops = 3 * 2 * 32 * 64 * (64 + 32)  # three GEMMs per linear, 2 FLOPs per multiply-add
    half = policy_share(model, "every-linear", tokens=32, other_flops=linear_flops)
    assert half.fp8_flop_share == pytest.approx(0.5) and half.flop_bound_speedup == pytest.approx(1 / 0.75)


def test_each_failure_mode_is_found_with_its_number(monkeypatch):
    found = diagnose_causal_lm(tiny(vocab_size=500), batch_size=3, seq_len=7, compile_model=False)
    assert {"FP8 without torch.compile", "shape-rule: no layer converted", "dimensions FP8 GEMMs cannot take",
            "tokens per micro-batch not a multiple of 16", "layers too small for tensorwise FP8",
            "Accelerate's default filter"} <= set(causes(found))  # fmt: skip
    by_cause = {f.cause: f for f in found.findings}
    assert (
        "1 linears have a dim not divisible by 16 (e.g. hf.lm_head)"
        in by_cause["dimensions FP8 GEMMs cannot take"].measured
    )
    assert by_cause["tokens per micro-batch not a multiple of 16"].measured == "21 tokens"
    assert not by_cause["Accelerate's default filter"].problem
    monkeypatch.setattr(diagnosis, "torchao_version", lambda: (None, "ImportError: No module named 'torchao'"))
    missing = diagnose_causal_lm(tiny(), batch_size=2, seq_len=16)
    assert causes(missing)[0] == "FP8 backend missing" and "No module named" in missing.findings[0].measured
    assert "FP8 without torch.compile" not in causes(missing)


def test_a_model_too_small_for_fp8_is_told_so():
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False))
    found = diagnose(model, tokens=64, n_layers=1, dim=64, seq_len=64_000)  # attention dwarfs the linears
    low = next(f for f in found.findings if f.cause == "too little of the step in FP8 GEMMs")
    assert "train it in BF16" in low.advice
    assert found.to_dict()["policies"][2]["fp8_flop_share"] < diagnosis.LOW_SHARE
