"""FP8 support checks and TorchAO float8 conversion: filters, ordering errors, numerics, checkpoint layout.

CPU tests use torchao's emulation (FP8 rounding with high-precision matmuls) on bfloat16 models; the
@pytest.mark.gpu tests run the real FP8 kernels and are skipped without CUDA.
"""

import copy
import math
import sys

import pytest
import torch
from numerics import sqnr_db
from tiny import tiny_model
from torch import nn

from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.errors import ConfigError, NotSupportedHere
from cs336_basics.model import TransformerLM
from cs336_basics.precision import (
    FP8Support,
    check_fp8_support,
    check_fp8_tokens,
    convert_model_to_fp8,
    count_float8_linears,
    describe_format,
    fp8_gemm_pays,
    module_filter,
    require_fp8,
    skip_reason,
    torchao_float8_config,
)
from cs336_basics.precision.rules import SKIP_LM_HEAD, SKIP_NOT_16, SKIP_SMALL

# Every linear dim a multiple of 16 so that all of them are FP8-eligible: 2 layers x 7 linears + lm_head.
TINY = tiny_model()
N_BLOCK_LINEARS = 2 * 7

EMULATE = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="torchao")


def emulated(**overrides) -> FP8Config:
    return FP8Config(use_fp8=True, fp8_emulate=True, **overrides)


def tiny_lm(seed: int = 0, config: ModelConfig = TINY) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(config).to(torch.bfloat16)


class Stack(nn.Module):
    """Named nn.Linear children, for conversion logic that does not need a whole LM."""

    def __init__(self, **linears: nn.Linear) -> None:
        super().__init__()
        for name, linear in linears.items():
            self.add_module(name, linear)


def linears(device: str = "cpu", **shapes: tuple[int, int]) -> Stack:
    """Stack(name=Linear(in, out)) in bfloat16; device="meta" costs nothing at any size."""
    return Stack(
        **{name: nn.Linear(i, o, bias=False, device=device, dtype=torch.bfloat16) for name, (i, o) in shapes.items()}
    )


# ---- support checks ----


def test_check_fp8_support_on_cpu_reports_no_and_why():
    support = check_fp8_support(torch.device("cpu"))
    assert not support.ok and not support.capability_ok and not support.scaled_mm_ok
    assert support.device == "cpu" and support.capability is None
    assert "GPU" in support.reason and "8.9" in support.reason
    assert support.torchao_ok and support.torchao_version
    text = support.format()
    assert "FP8 support: no" in text and "torch " in text and "reason:" in text


def test_require_fp8_on_cpu_needs_emulate():
    cpu = check_fp8_support("cpu")
    with pytest.raises(NotSupportedHere, match=r"H100-class GPU \(sm_89\+\); on CPU use --fp8_emulate"):
        require_fp8(FP8Config(use_fp8=True), cpu)
    support = require_fp8(EMULATE, cpu)  # allowed: numerics only, and the report says so
    assert isinstance(support, FP8Support) and "emulated" in support.note and "note:" in support.format()
    require_fp8(FP8Config(use_fp8=False), cpu)  # nothing asked for, nothing required


def test_support_is_probed_once_per_device():
    assert check_fp8_support("cpu") is check_fp8_support(torch.device("cpu"))


def test_torchao_missing_gives_install_hint(monkeypatch):
    # None in sys.modules makes `import torchao` raise ImportError, as if it were not installed.
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(NotSupportedHere, match=r"uv sync.*torchao>=0\.18"):
        require_fp8(EMULATE, check_fp8_support("cpu"))
    with pytest.raises(ConfigError, match=r"torchao>=0\.18"):
        convert_model_to_fp8(linears(a=(32, 32)), EMULATE)
    with pytest.raises(ConfigError, match="torchao"):
        torchao_float8_config(EMULATE)
    assert count_float8_linears(linears(a=(32, 32))) == 0


# ---- our config -> torchao's config ----


def test_auto_tensorwise_is_hybrid_and_e4m3_overrides_grad_output():
    auto = torchao_float8_config(FP8Config(use_fp8=True))
    assert auto.cast_config_input.target_dtype == torch.float8_e4m3fn
    assert auto.cast_config_weight.target_dtype == torch.float8_e4m3fn
    assert auto.cast_config_grad_output.target_dtype == torch.float8_e5m2
    assert not auto.emulate
    assert describe_format(auto) == "E4M3 forward / E5M2 gradients"

    hybrid = torchao_float8_config(FP8Config(use_fp8=True, fp8_format="hybrid"))
    assert hybrid.cast_config_grad_output.target_dtype == torch.float8_e5m2

    e4m3 = torchao_float8_config(emulated(fp8_format="e4m3"))
    # grad_output is cast in two GEMMs; both must change or torchao's own check would fail.
    assert e4m3.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    assert e4m3.cast_config_grad_output_for_grad_weight.target_dtype == torch.float8_e4m3fn
    assert e4m3.emulate
    assert describe_format(e4m3, short=True) == "E4M3 fwd / E4M3 grad"


@pytest.mark.parametrize("recipe", ["rowwise", "rowwise_with_gw_hp"])
def test_rowwise_recipes_keep_their_e4m3_gradients(recipe):
    for fmt in ("auto", "e4m3"):
        config = torchao_float8_config(FP8Config(use_fp8=True, fp8_recipe=recipe, fp8_format=fmt))
        assert config.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
        assert config.round_scales_to_power_of_2
    with pytest.raises(ConfigError, match=r"hybrid.*--fp8_recipe tensorwise"):
        torchao_float8_config(FP8Config(use_fp8=True, fp8_recipe=recipe, fp8_format="hybrid"))


def test_gw_hp_format_description_says_grad_weight_is_high_precision():
    config = torchao_float8_config(FP8Config(use_fp8=True, fp8_recipe="rowwise_with_gw_hp"))
    assert "grad_weight GEMM in high precision" in describe_format(config)


# ---- filters ----


def test_default_converts_every_block_linear_but_not_lm_head():
    model = tiny_lm()
    report = convert_model_to_fp8(model, EMULATE)
    assert report.n_converted == N_BLOCK_LINEARS == count_float8_linears(model)
    assert set(report.converted) == {
        f"layers.{i}.{name}"
        for i in range(2)
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj", "ffn.w1", "ffn.w2", "ffn.w3")
    }
    assert report.skipped == {"lm_head": SKIP_LM_HEAD}
    assert type(model.lm_head) is nn.Linear
    assert report.summary_line() == (
        "tensorwise (emulated), E4M3 fwd / E5M2 grad: 14 of 15 linears converted; "
        "skipped: lm_head (output projection: --fp8_lm_head to convert)"
    )


def test_fp8_lm_head_converts_it_too():
    model = tiny_lm()
    report = convert_model_to_fp8(model, emulated(fp8_lm_head=True))
    assert report.n_converted == N_BLOCK_LINEARS + 1 == count_float8_linears(model)
    assert "lm_head" in report.converted and not report.skipped


def test_dims_not_divisible_by_16_are_skipped_with_reason():
    model = linears(ok=(32, 48), odd_out=(48, 40), odd_in=(40, 32))
    report = convert_model_to_fp8(model, EMULATE)
    assert report.converted == ["ok"]
    assert set(report.skipped) == {"odd_out", "odd_in"}
    assert report.skipped["odd_out"] == f"{SKIP_NOT_16} (in_features=48, out_features=40)"
    assert "2 dims not divisible by 16" in report.summary_line()


def test_shape_rule_matches_torchaos_thresholds():
    # tensorwise: skip when K <= 4096 and N <= 1024 (N = out_features, K = in_features).
    assert not fp8_gemm_pays(out_features=1024, in_features=4096, recipe="tensorwise")
    assert fp8_gemm_pays(out_features=1040, in_features=64, recipe="tensorwise")
    assert fp8_gemm_pays(out_features=64, in_features=4112, recipe="tensorwise")
    # rowwise: skip when N <= 2048, or K <= 1024, or (N <= 4096 and K <= 2048).
    assert not fp8_gemm_pays(out_features=2048, in_features=8192, recipe="rowwise")
    assert not fp8_gemm_pays(out_features=8192, in_features=1024, recipe="rowwise")
    assert not fp8_gemm_pays(out_features=4096, in_features=2048, recipe="rowwise")
    assert fp8_gemm_pays(out_features=4096, in_features=2064, recipe="rowwise")
    assert fp8_gemm_pays(out_features=4112, in_features=1040, recipe="rowwise")
    # rowwise_with_gw_hp has no torchao auto filter: it uses the rowwise rule.
    for n, k in ((4096, 2048), (4096, 2064), (2048, 8192)):
        assert fp8_gemm_pays(n, k, "rowwise_with_gw_hp") == fp8_gemm_pays(n, k, "rowwise")


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_shape_rule_agrees_with_torchaos_own_filter(recipe):
    """Our rule (which also explains each skip) decides exactly as torchao's auto filter, on a grid of shapes that
    crosses every threshold; torchao's filter also applies the divisible-by-16 rule, so ours is composed with it."""
    ao_utils = pytest.importorskip("torchao.float8.float8_linear_utils")
    ao_filter = ao_utils._auto_filter_for_recipe(recipe, filter_fqns=[])
    dims = (16, 40, 1024, 1040, 2048, 2064, 4096, 4112, 8192)
    for n in dims:
        for k in dims:
            module = nn.Linear(k, n, bias=False, device="meta")
            ours = fp8_gemm_pays(n, k, recipe) and n % 16 == 0 and k % 16 == 0
            assert ours == ao_filter(module, "layers.0.ffn.w1"), (recipe, n, k)


def test_shape_filter_on_366m_shapes():
    # The 366m preset's layers (dim 896, d_ff 3584, vocab 32000) on the meta device: no memory needed.
    model = linears("meta", q_proj=(896, 896), w1=(896, 3584), w2=(3584, 896), lm_head=(896, 32000))
    tensorwise = emulated(fp8_shape_filter=True, fp8_lm_head=True)
    keep = module_filter(tensorwise)
    decisions = {name: keep(m, name) for name, m in model.named_children()}
    # Only layers with N = out_features > 1024 pay under tensorwise (K <= 4096 for all of them).
    assert decisions == {"q_proj": False, "w1": True, "w2": False, "lm_head": True}
    assert skip_reason(model.w2, "w2", tensorwise).startswith(SKIP_SMALL)
    assert "out_features=896, in_features=3584" in skip_reason(model.w2, "w2", tensorwise)
    # rowwise also needs K > 1024, which no 896-wide input has.
    rowwise = emulated(fp8_shape_filter=True, fp8_lm_head=True, fp8_recipe="rowwise")
    assert not any(module_filter(rowwise)(m, n) for n, m in model.named_children())
    # Without the lm_head flag the output projection is skipped for that reason first.
    assert skip_reason(model.lm_head, "lm_head", emulated(fp8_shape_filter=True)) == SKIP_LM_HEAD


def test_shape_filter_conversion_converts_and_skips_the_right_layers():
    model = linears(up=(896, 3584), down=(3584, 896))  # ~13 MB of bf16 weights, cheap on CPU
    report = convert_model_to_fp8(model, emulated(fp8_shape_filter=True))
    assert report.converted == ["up"] and list(report.skipped) == ["down"]
    assert count_float8_linears(model) == 1
    assert "down (below the shape threshold" in report.summary_line()


def test_nothing_to_convert_is_an_error_with_reasons():
    model = tiny_lm()
    with pytest.raises(ConfigError) as err:
        convert_model_to_fp8(model, emulated(fp8_shape_filter=True))
    message = str(err.value)
    assert "none of the model's 15 linear layers" in message
    # One line: the layers grouped by reason, an example of each.
    assert "\n" not in message and "lm_head: output projection" in message
    assert "14 like layers.0.attn.q_proj: below the shape threshold" in message
    assert "--fp8_lm_head" in message and "--no_fp8_shape_filter" in message
    assert count_float8_linears(model) == 0  # the model is left untouched
    with pytest.raises(ConfigError, match="divisible by 16"):
        convert_model_to_fp8(linears(a=(40, 40)), EMULATE)


# ---- ordering errors ----


def test_compiled_models_are_refused():
    order = r"create model -> move to CUDA \+ BF16 -> convert to FP8 -> torch.compile"
    with pytest.raises(ConfigError, match=order):
        convert_model_to_fp8(torch.compile(tiny_lm()), EMULATE)
    in_place = tiny_lm()
    in_place.compile()
    with pytest.raises(ConfigError, match=order):
        convert_model_to_fp8(in_place, EMULATE)
    one_block = tiny_lm()
    one_block.layers[1].compile()
    with pytest.raises(ConfigError, match=r"layers\.1"):
        convert_model_to_fp8(one_block, EMULATE)
    assert count_float8_linears(one_block) == 0


def test_float32_model_is_refused():
    model = tiny_lm().float()
    with pytest.raises(ConfigError, match=r'bfloat16.*model\.to\(device="cuda", dtype=torch\.bfloat16\)'):
        convert_model_to_fp8(model, EMULATE)


def test_cpu_model_without_emulate_is_refused():
    with pytest.raises(ConfigError, match=r"on CUDA.*--fp8_emulate"):
        convert_model_to_fp8(tiny_lm(), FP8Config(use_fp8=True))


def test_converting_twice_is_refused():
    model = tiny_lm()
    convert_model_to_fp8(model, EMULATE)
    with pytest.raises(ConfigError, match="already has 14 Float8Linear"):
        convert_model_to_fp8(model, EMULATE)


def test_fp8_backward_needs_a_token_count_divisible_by_16():
    for recipe in ("tensorwise", "rowwise"):
        with pytest.raises(ConfigError, match=r"multiple of 16 \(batch_size 4 x sequence length 5 = 20\)"):
            check_fp8_tokens(4, 5, FP8Config(use_fp8=True, fp8_recipe=recipe))
        check_fp8_tokens(4, 64, FP8Config(use_fp8=True, fp8_recipe=recipe))
    # grad_weight in high precision, emulation, or no FP8 at all: no constraint.
    check_fp8_tokens(4, 5, FP8Config(use_fp8=True, fp8_recipe="rowwise_with_gw_hp"))
    check_fp8_tokens(4, 5, EMULATE)
    check_fp8_tokens(4, 5, FP8Config())


# ---- checkpoints and parameters ----


def test_state_dict_keys_and_parameters_survive_conversion():
    model = tiny_lm()
    keys = list(model.state_dict())
    params = dict(model.named_parameters())
    convert_model_to_fp8(model, emulated(fp8_lm_head=True))
    assert list(model.state_dict()) == keys
    # The same Parameter objects: an optimizer built before conversion would still be stepping them.
    assert all(p is params[name] for name, p in model.named_parameters())


def test_bf16_and_fp8_state_dicts_interchange():
    bf16 = tiny_lm(seed=0)
    fp8 = tiny_lm(seed=1)
    convert_model_to_fp8(fp8, EMULATE)
    fp8.load_state_dict(bf16.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(bf16.state_dict().values(), fp8.state_dict().values(), strict=True))

    other = tiny_lm(seed=2)
    other.load_state_dict(fp8.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), fp8.state_dict().values(), strict=True))


def test_count_sees_through_a_compile_wrapper():
    model = tiny_lm()
    convert_model_to_fp8(model, EMULATE)
    assert count_float8_linears(torch.compile(model)) == N_BLOCK_LINEARS


# ---- numerics ----


@pytest.mark.parametrize(
    "recipe, fmt", [("tensorwise", "auto"), ("tensorwise", "e4m3"), ("rowwise", "auto"), ("rowwise_with_gw_hp", "auto")]
)
def test_emulated_fp8_forward_backward_close_to_bf16(recipe, fmt):
    """FP8 rounds inputs, weights and gradients to 3 (E4M3) or 2 (E5M2) mantissa bits, so expect ~20-30 dB
    SQNR against BF16 rather than equality. Thresholds: logits > 20 dB (seen: ~24), every weight gradient
    > 14 dB (seen: 17-18; gradients pass through two FP8 GEMMs per layer), loss within 1% (seen: < 0.1%)."""
    bf16 = tiny_lm()
    fp8 = copy.deepcopy(bf16)
    report = convert_model_to_fp8(fp8, emulated(fp8_recipe=recipe, fp8_format=fmt, fp8_lm_head=True))
    assert report.n_converted == N_BLOCK_LINEARS + 1

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TINY.vocab_size, (4, TINY.context_length), generator=gen)
    targets = torch.randint(0, TINY.vocab_size, (4, TINY.context_length), generator=gen)
    with torch.no_grad():
        assert sqnr_db(bf16(ids), fp8(ids)) > 20
    loss_bf16, loss_fp8 = bf16(ids, targets), fp8(ids, targets)
    loss_bf16.backward()
    loss_fp8.backward()
    assert math.isfinite(loss_fp8.item())
    assert abs(loss_fp8.item() - loss_bf16.item()) / loss_bf16.item() < 0.01
    grads_fp8 = dict(fp8.named_parameters())
    for name, p in bf16.named_parameters():
        assert sqnr_db(p.grad, grads_fp8[name].grad) > 14, name


# ---- GPU: real FP8 kernels ----


@pytest.mark.gpu
def test_check_fp8_support_on_cuda():
    support = check_fp8_support("cuda")
    assert support.capability is not None and support.device != "cpu"
    assert support.capability_ok == (support.capability >= (8, 9))
    if support.capability_ok:
        assert support.scaled_mm_ok and support.ok and support.reason == "", support.format()
        assert require_fp8(FP8Config(use_fp8=True), support).ok
    else:
        with pytest.raises(ConfigError, match="compute capability"):
            require_fp8(FP8Config(use_fp8=True), support)
    assert "no FP8 tensor cores" in require_fp8(EMULATE, support).note


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_real_fp8_compiled_training_step_on_cuda(recipe):
    if not check_fp8_support("cuda").ok:
        pytest.skip("this GPU cannot run FP8 (needs sm_89+)")
    config = ModelConfig(vocab_size=512, context_length=64, dim=256, n_layers=2, n_heads=4, intermediate_size=512)
    torch.manual_seed(0)
    bf16 = TransformerLM(config).to(device="cuda", dtype=torch.bfloat16)  # create -> CUDA + BF16
    fp8 = copy.deepcopy(bf16)
    report = convert_model_to_fp8(fp8, FP8Config(use_fp8=True, fp8_recipe=recipe, fp8_lm_head=True))  # -> FP8
    assert report.n_converted == 2 * 7 + 1 and not report.emulate
    compiled = torch.compile(fp8)  # -> compile, last
    assert count_float8_linears(compiled) == report.n_converted

    # 4 x 64 = 256 tokens: the token count is a GEMM dim in backward, so it must be a multiple of 16 too.
    ids = torch.randint(0, config.vocab_size, (4, config.context_length), device="cuda")
    targets = torch.randint(0, config.vocab_size, (4, config.context_length), device="cuda")
    optimizer = torch.optim.AdamW(fp8.parameters(), lr=1e-3)
    loss = compiled(ids, targets)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fp8.parameters())
    optimizer.step()
    with torch.no_grad():
        reference = bf16(ids, targets).item()
        after = compiled(ids, targets).item()
    assert math.isfinite(loss.item()) and math.isfinite(after)
    assert abs(loss.item() - reference) / reference < 0.02
    assert after < loss.item()  # one step on the same batch lowers its loss


@pytest.mark.gpu
def test_token_count_rule_matches_the_kernels():
    """check_fp8_tokens encodes a _scaled_mm limit; if a torch release lifts it, this says the rule is stale."""
    if not check_fp8_support("cuda").ok:
        pytest.skip("this GPU cannot run FP8 (needs sm_89+)")

    def backward_runs(recipe: str, tokens: int) -> bool:
        model = linears("cuda", a=(64, 64))
        convert_model_to_fp8(model, FP8Config(use_fp8=True, fp8_recipe=recipe))
        x = torch.randn(tokens, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        try:
            model.a(x).float().square().mean().backward()
        except RuntimeError:
            return False
        return True

    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp"):
        cfg = FP8Config(use_fp8=True, fp8_recipe=recipe)
        assert backward_runs(recipe, 32)
        try:
            check_fp8_tokens(4, 5, cfg)
            allowed = True
        except ConfigError:
            allowed = False
        assert backward_runs(recipe, 20) == allowed, recipe
