"""The fused FP8 path (--fp8_path fused): casts and scales against their definitions, the FP8 linears against a
BF16/float reference (values and gradients), shared input casts, the delayed-scaling state machine, conversion,
the errors for impossible combinations, and training (checkpoint interchange, exact resume). CPU: torch runs FP8
casts and _scaled_mm on CPU, so these are the real numerics; GPU tests are marked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from numerics import RecordScaledMM, sqnr_db
from tiny import TINY_FLAGS, TINY_MODEL, tiny_model
from torch import nn

import train_h100
from cs336_basics.build import build, plan
from cs336_basics.config import FP8Config
from cs336_basics.config_layers import build_config
from cs336_basics.errors import ConfigError
from cs336_basics.model import TransformerLM
from cs336_basics.precision import FusedFP8, choose_fp8
from cs336_basics.precision.fused.convert import count_fused_linears
from cs336_basics.precision.fused.head import Fp8LMHead
from cs336_basics.precision.fused.linear import Fp8Linear, Fp8SharedInputLinears, fp8_linears
from cs336_basics.precision.fused.qkv_rope import Fp8QkvRope
from cs336_basics.precision.fused.scaling import (
    E4M3,
    E5M2,
    GRAD,
    INPUT,
    WEIGHT,
    DelayedScalingState,
    SiteScaling,
    amax_to_scale,
    cast_to_fp8,
)
from cs336_basics.precision.fused.swiglu import Fp8SwiGLU
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, read_checkpoint, save_torch_file
from cs336_basics.training.metrics import read_metrics
from cs336_basics.training.restore import load_checkpoint

FUSED = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused")
DELAYED = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_scaling="delayed")
DTYPES = (E4M3, E4M3, E5M2)


def tiny_lm(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(tiny_model()).to(torch.bfloat16)


# ---- casts and scales ----


def test_cast_saturates_instead_of_overflowing():
    x = torch.tensor([1.0, -1000.0, 1000.0, 1e-9])
    out = cast_to_fp8(x, torch.tensor(1.0), E4M3).float()
    assert out.tolist()[:3] == [1.0, -448.0, 448.0] and torch.isfinite(out).all()


def test_dynamic_scale_is_torchaos_formula():
    amax = torch.tensor(3.5, dtype=torch.bfloat16)
    assert amax_to_scale(amax, E4M3).item() == pytest.approx(448.0 / 3.5)
    assert amax_to_scale(torch.tensor(0.0), E5M2).item() == pytest.approx(57344.0 / 1e-12, rel=1e-6)  # no inf
    torchao_utils = pytest.importorskip("torchao.float8.float8_utils")
    for value in (1e-6, 0.37, 3.5, 1e4):
        a = torch.tensor(value)
        assert torch.equal(amax_to_scale(a, E4M3), torchao_utils.amax_to_scale(a, E4M3))


# ---- one FP8 linear against the reference ----


def test_fp8_linear_matches_bf16_values_and_gradients():
    torch.manual_seed(0)
    x = torch.randn(4, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(96, 64) * 0.05).to(torch.bfloat16).requires_grad_()
    (y,) = fp8_linears(x, (weight,), (SiteScaling(DTYPES),), record=True)
    upstream = torch.randn_like(y)
    (y * upstream).sum().backward()
    x_ref, w_ref = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    y_ref = x_ref @ w_ref.t()
    (y_ref * upstream.double()).sum().backward()
    assert y.shape == (4, 32, 96) and y.dtype == torch.bfloat16
    assert sqnr_db(y_ref, y) > 25  # E4M3 x E4M3 with fp32 accumulation
    assert sqnr_db(x_ref.grad, x.grad) > 20 and sqnr_db(w_ref.grad, weight.grad) > 20  # E5M2 gradients


def test_backward_operands_are_saved_in_fp8_and_transposed():
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(48, 64, dtype=torch.bfloat16, requires_grad=True)
    (y,) = fp8_linears(x, (weight,), (SiteScaling(DTYPES),), record=True)
    x_t, x_scale, w_t, w_scale = y.grad_fn.saved_tensors
    assert x_t.dtype == E4M3 and x_t.shape == (64, 32) and x_t.is_contiguous()  # x^T, K-major for grad_weight
    assert w_t.dtype == E4M3 and w_t.shape == (64, 48) and w_t.is_contiguous()  # W^T, for grad_input
    assert x_scale.dtype == w_scale.dtype == torch.float32


def test_a_shared_input_group_equals_its_linears_run_one_by_one():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    weights = [torch.randn(n, 64, dtype=torch.bfloat16) * 0.05 for n in (32, 16, 16)]
    grads = [torch.randn(2, 16, n, dtype=torch.bfloat16) for n in (32, 16, 16)]

    def run(shared: bool):
        xs = x.clone().requires_grad_()
        ws = [w.clone().requires_grad_() for w in weights]
        scalings = tuple(SiteScaling(DTYPES) for _ in ws)
        if shared:
            outs = fp8_linears(xs, tuple(ws), scalings, record=True)
        else:
            outs = [fp8_linears(xs, (w,), (s,), record=True)[0] for w, s in zip(ws, scalings, strict=True)]
        sum((o.float() * g.float()).sum() for o, g in zip(outs, grads, strict=True)).backward()
        return outs, xs.grad, [w.grad for w in ws]

    outs_a, dx_a, dws_a = run(shared=True)
    outs_b, dx_b, dws_b = run(shared=False)
    # The shared input is cast once with the same dynamic scale each linear would use: identical FP8 GEMMs.
    for a, b in zip([*outs_a, *dws_a], [*outs_b, *dws_b], strict=True):
        assert torch.equal(a, b)
    torch.testing.assert_close(dx_a, dx_b, rtol=1e-2, atol=1e-2)  # the three parts are summed in another order


# ---- delayed scaling: the state machine ----


def delayed_sites(n: int = 2, **kwargs) -> tuple[list[SiteScaling], DelayedScalingState]:
    sites = [SiteScaling(DTYPES, delayed=True) for _ in range(n)]
    return sites, DelayedScalingState(sites, **kwargs)


def record(site: SiteScaling, role: int, value: float) -> None:
    site.cast(torch.full((4, 4), value), role, record=True)


def test_delayed_scales_start_at_one_and_follow_the_history_max():
    sites, state = delayed_sites(history_len=3)
    assert sites[0].scale.tolist() == [1.0, 1.0, 1.0]
    for value in (8.0, 2.0, 4.0):
        record(sites[0], INPUT, value)
        state.update()
    assert sites[0].scale[INPUT].item() == pytest.approx(448.0 / 8.0)
    record(sites[0], INPUT, 1.0)  # the oldest entry, 8.0, falls out of a 3-step history
    state.update()
    assert sites[0].scale[INPUT].item() == pytest.approx(448.0 / 4.0)
    # Roles never recorded keep their scale, and the other site is untouched.
    assert sites[0].scale[WEIGHT].item() == 1.0 and sites[1].scale.tolist() == [1.0, 1.0, 1.0]
    # The GEMMs take the inverse scales, which the update writes beside the scales.
    assert torch.equal(torch.stack(sites[0].scale_inv_buffers()), sites[0].scale.reciprocal())


def test_most_recent_algo_and_margin():
    sites, state = delayed_sites(history_len=4, algo="most_recent", margin=2)
    for value in (16.0, 2.0):
        record(sites[0], GRAD, value)
        state.update()
    assert sites[0].scale[GRAD].item() == pytest.approx(57344.0 / (2.0 * 4))


def test_amax_is_max_accumulated_within_a_step():
    # Micro-batches and activation-checkpointing recomputes record into one step: the max survives.
    sites, state = delayed_sites()
    for value in (3.0, 7.0, 5.0):
        record(sites[1], WEIGHT, value)
    assert sites[1].amax[WEIGHT].item() == 7.0
    state.update()
    assert sites[1].amax.tolist() == [0.0, 0.0, 0.0]  # reset for the next step


@pytest.mark.parametrize(("rows", "sized_for"), [(48, None), (5, None), (48, 48), (7, 48)])
@pytest.mark.parametrize("grad_row", [None, 8])
def test_recorded_amax_and_saturation_count_are_exact_for_any_row_count(rows, sized_for, grad_row):
    # The cast records per row: straight into buffers sized for its rows, else folded into bins of rows first. An
    # output gradient recorded in pieces of `grad_row` features (a row of 24 in three) is folded the same way.
    sites = [SiteScaling(DTYPES, delayed=True, grad_row=grad_row) for _ in range(2)]
    state = DelayedScalingState(sites)
    if sized_for is not None:
        state.size_row_buffers(sized_for)
        assert sites[0].amax_input.shape == (sized_for,) and sites[0].saturated_grad.shape == (sized_for,)
    record(sites[0], GRAD, 1.0)
    state.update()  # scale 57344 (E5M2's max)
    x = torch.randn(rows, 24) / 2
    x[rows - 1, 3] = 9.0
    sites[0].cast(x, GRAD, record=True)
    assert sites[0].amax[GRAD].item() == 9.0
    assert state.take_saturated() == int((x.abs() * 57344.0 > 57344.0).sum())


def test_overflow_saturates_and_is_counted():
    sites, state = delayed_sites()
    record(sites[0], INPUT, 1.0)
    state.update()  # scale 448: a value of 2 now exceeds the range
    x = torch.tensor([[0.5, 2.0, -3.0, 1.0]])
    out, _ = sites[0].cast(x, INPUT, record=True)
    assert out.float().tolist()[0][1:3] == [448.0, -448.0]
    assert state.take_saturated() == 2 and state.take_saturated() == 0
    sites[0].cast(x, INPUT, record=False)  # evaluation records nothing
    assert state.take_saturated() == 0


def test_scaling_state_round_trips_for_resume():
    sites, state = delayed_sites(history_len=4)
    for value in (2.0, 4.0):
        record(sites[0], INPUT, value)
        state.update()
    saved = state.scaling_state()
    fresh_sites, fresh = delayed_sites(history_len=4)
    fresh.load_scaling_state(saved)
    assert fresh.cursor == state.cursor and torch.equal(fresh.history, state.history)
    assert torch.equal(fresh_sites[0].scale, sites[0].scale)
    assert torch.equal(torch.stack(fresh_sites[0].scale_inv_buffers()), torch.stack(sites[0].scale_inv_buffers()))
    with pytest.raises(ValueError, match="does not fit"):
        delayed_sites(history_len=8)[1].load_scaling_state(saved)


def test_a_resume_with_other_tokens_per_step_rescales_the_gradient_amaxes():
    # A rank's backward divides each token's loss by its tokens per step, so its output gradients, and their amaxes,
    # scale with the inverse: a state saved at 4 x 2 tokens per step, resumed at 8 x 2 (half the ranks, the same
    # global batch), sees gradients half as large.
    sites, state = delayed_sites(history_len=4)
    state.set_step_tokens(4, 2)
    for value in (2.0, 4.0):
        record(sites[0], INPUT, value)
        record(sites[0], GRAD, value)
        state.update()
    saved = state.scaling_state()
    fresh_sites, fresh = delayed_sites(history_len=4)
    fresh.set_step_tokens(8, 2)
    fresh.load_scaling_state(saved)
    assert torch.equal(fresh.history[:, GRAD], state.history[:, GRAD] / 2)
    assert torch.equal(fresh.history[:, INPUT], state.history[:, INPUT])
    assert fresh_sites[0].scale[GRAD] == 2 * sites[0].scale[GRAD]
    assert torch.equal(fresh_sites[0].scale[:GRAD], sites[0].scale[:GRAD])
    assert fresh_sites[0].scale_inv(GRAD) == 1 / fresh_sites[0].scale[GRAD]
    assert fresh_sites[1].scale.tolist() == [1.0, 1.0, 1.0]  # nothing recorded: the initial scales stay
    # The next step's gradients, half as large as the saved run's would be, get its scale times two: the same FP8.
    record(sites[0], GRAD, 3.0)
    record(fresh_sites[0], GRAD, 1.5)
    state.update()
    fresh.update()
    assert fresh_sites[0].scale[GRAD] == 2 * sites[0].scale[GRAD]
    # The same tokens per step, or a checkpoint written before they were kept: loaded as saved.
    for state_tokens in (8, None):
        again_sites, again = delayed_sites(history_len=4)
        again.set_step_tokens(4, 2)
        again.load_scaling_state({**saved, "step_tokens": state_tokens})
        assert torch.equal(again.history, saved["history"]) and torch.equal(again_sites[0].scale, saved["scale"][0])


def test_scale_update_in_one_launch_matches_the_op_by_op_update_in_the_triton_interpreter():
    # The kernel's arithmetic on the CPU, for CI: the interpreter must be on before triton is imported.
    pytest.importorskip("triton")
    tests = Path(__file__).parent
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
    }
    code = "import scale_update_check; scale_update_check.check_in_interpreter(); print('update ok')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "update ok" in done.stdout, done.stderr[-3000:]


@pytest.mark.gpu
def test_scale_update_in_one_launch_matches_the_op_by_op_update_on_the_gpu():
    import scale_update_check

    scale_update_check.check("cuda")
    assert DelayedScalingState([SiteScaling(DTYPES, delayed=True, device="cuda")])._launch is not None  # the default


# ---- conversion ----


def test_conversion_keeps_the_state_dict_and_shares_input_casts():
    model = tiny_lm()
    keys = list(model.state_dict())
    report = FusedFP8(FUSED).convert(model)
    assert list(model.state_dict()) == keys
    assert report.n_converted == 14 and report.shared_input_groups == 2 and report.fused_swiglu_blocks == 2
    assert count_fused_linears(model) == 14
    attn, ffn = model.layers[0].attn, model.layers[0].ffn
    assert isinstance(attn.qkv_rope, Fp8QkvRope) and attn.qkv is None and isinstance(ffn, Fp8SwiGLU)
    assert isinstance(attn.output_proj, Fp8Linear) and ffn.producers == "torch reference"
    assert attn.output_proj.weight is dict(model.named_parameters())["layers.0.attn.output_proj.weight"]
    line = report.summary_line()
    assert "14 of 15 linears converted (2 groups share an input cast, 2 with RoPE fused) (2 SwiGLU blocks fused" in line

    # Without the fused RoPE, q/k/v are a plain shared-input group and attention rotates their outputs itself.
    model = tiny_lm()
    report = FusedFP8(FP8Config(**{**vars(FUSED), "fp8_fused_rope": False})).convert(model)
    assert report.shared_input_groups == 2 and report.fused_rope_groups == 0
    assert isinstance(model.layers[0].attn.qkv, Fp8SharedInputLinears) and model.layers[0].attn.qkv_rope is None

    # Without the fused SwiGLU, w1/w3 share their input cast and w2 is a linear of its own.
    model = tiny_lm()
    report = FusedFP8(FP8Config(**{**vars(FUSED), "fp8_fused_swiglu": False})).convert(model)
    assert report.shared_input_groups == 4 and report.fused_swiglu_blocks == 0 and count_fused_linears(model) == 14
    ffn = model.layers[0].ffn
    assert isinstance(ffn.w13, Fp8SharedInputLinears) and isinstance(ffn.w2, Fp8Linear)


def test_conversion_follows_the_filters_and_splits_groups_that_do_not_all_convert():
    model = tiny_lm()
    cfg = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_lm_head=True, fp8_share_input_casts=False)
    report = FusedFP8(cfg).convert(model)
    assert report.n_converted == 15 and report.shared_input_groups == 0 and report.fused_loss_head
    assert model.layers[0].attn.qkv is None and isinstance(model.layers[0].attn.q_proj, Fp8Linear)
    assert isinstance(model.lm_head, Fp8LMHead)
    with pytest.raises(ConfigError, match="none of the model's 15 linear layers"):
        FusedFP8(FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_shape_filter=True)).convert(tiny_lm())
    with pytest.raises(ConfigError, match="already converted"):
        FusedFP8(cfg).convert(model)


def test_a_linear_with_a_bias_is_refused_not_dropped():
    model = nn.Sequential(nn.Linear(32, 32).to(torch.bfloat16))
    with pytest.raises(ConfigError, match="without bias; 0 have one"):
        FusedFP8(FUSED).convert(model)


def test_delayed_conversion_gives_each_linear_its_scaling_and_the_converter_one_state():
    model = tiny_lm()
    converter = FusedFP8(DELAYED)
    converter.convert(model)
    assert isinstance(converter.scaling, DelayedScalingState) and len(converter.scaling.sites) == 14
    assert not any("fp8_scaling" in k or "scaling." in k for k in model.state_dict())
    # A weight's amax is recorded per row, one buffer entry per output feature.
    proj = model.layers[0].attn.output_proj
    assert proj.scaling.amax_weight.shape == (proj.out_features,)


def test_the_trainer_sizes_the_recordings_for_its_micro_batches(tmp_path):
    import numpy as np

    from cs336_basics.training.trainer import Trainer

    model = tiny_lm()
    converter = FusedFP8(DELAYED)
    converter.convert(model)
    train = dict(batch_size=3, max_steps=1, eval_every=0, out_dir=str(tmp_path), device="cpu", compile_model=False)
    config = build_config({"model": tiny_model().__dict__, "train": train, "fp8": vars(DELAYED)})
    data = np.random.default_rng(0).integers(0, 64, size=2000, dtype=np.uint16)
    trainer = Trainer(model, config, data, data, torch.device("cpu"), converter=converter)
    site = model.layers[0].attn.output_proj.scaling
    tokens = 3 * config.model.context_length
    assert site.amax_input.shape == site.saturated_grad.shape == (tokens,)
    trainer.train_step()
    recorded = converter.scaling.history[:, :, 0]
    # Every site's weight and gradient were recorded. Inputs: by the site that casts them, so in each of the two
    # blocks k, v (sharing q's cast) and w3 (sharing w1's) record none.
    assert recorded[:, WEIGHT:].min() > 0 and (recorded[:, INPUT] > 0).sum() == 2 * (7 - 3)


def test_converted_model_trains_close_to_bf16():
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (4, 16))
    bf16, fp8 = tiny_lm(), tiny_lm()
    FusedFP8(FUSED).convert(fp8)
    loss_bf16, loss_fp8 = bf16(ids, targets=ids), fp8(ids, targets=ids)
    assert loss_fp8.item() == pytest.approx(loss_bf16.item(), rel=0.02)
    loss_bf16.backward()
    loss_fp8.backward()
    grads = dict(fp8.named_parameters())
    for name, p in bf16.named_parameters():
        assert sqnr_db(p.grad, grads[name].grad) > 14, name


@pytest.mark.parametrize("fp8", [FUSED, DELAYED], ids=["dynamic", "delayed"])
def test_a_step_runs_three_fp8_gemms_per_linear_less_the_joined_input_gradients(fp8):
    # q/k/v's input gradients run as one GEMM (two fewer per block), w1/w3's too (one fewer). Each GEMM's two scales
    # have as many dimensions: on the GPU, inductor's lowering of the FP8 GEMM asserts it.
    model = tiny_lm()
    FusedFP8(fp8).convert(model)
    ids = torch.randint(0, 64, (4, 16))
    with RecordScaledMM() as gemms:
        model(ids, targets=ids).backward()
    assert len(gemms.calls) == 3 * 14 - 2 * (2 + 1)
    assert all(a == b for a, b in gemms.scale_dims), gemms.scale_dims


@pytest.mark.parametrize(
    "fp8, message",
    [
        ({"fp8_path": "torchao", "fp8_scaling": "delayed"}, "needs --fp8_path fused"),
        ({"fp8_path": "torchao", "fp8_fast_accum_backward": True}, "needs --fp8_path fused"),
        ({"fp8_path": "torchao", "fp8_fused_swiglu": False}, "--no_fp8_fused_swiglu needs --fp8_path fused"),
        ({"fp8_scaling": "delayed", "fp8_recipe": "rowwise"}, "needs the fused FP8 path and --fp8_recipe rowwise"),
        ({"fp8_path": "fused", "fp8_recipe": "rowwise"}, "implements the tensorwise recipe only"),
        ({"fp8_amax_history_len": 0}, "fp8_amax_history_len must be >= 1"),
        ({"fp8_margin": -1}, "fp8_margin must be >= 0"),
        ({"fp8_amax_compute_algo": "mean"}, "fp8_amax_compute_algo must be one of max, most_recent"),
    ],
)
def test_impossible_combinations_are_refused(fp8, message):
    with pytest.raises(ConfigError, match=message):  # by the config's field checks, or by the chosen path
        choose_fp8(build_config({"fp8": fp8}).fp8, world_size=1)


def test_the_fused_path_needs_no_torchao(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    config = build_config({"model": tiny_model().__dict__, "fp8": {**FUSED.__dict__}, "train": {"device": "cpu"}})
    built = build(plan(config))
    assert built.fp8_linears == 15  # the lm_head too: the fused path's default


# ---- training through train_h100 ----


def run(argv, capsys):
    code = train_h100.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def base(token_files):
    return [*TINY_FLAGS, *token_files, "--eval_every", "0", "--dtype", "bfloat16", "--log_every", "2"]


def test_delayed_run_reports_saturations_and_resumes_exactly(tmp_path, base, capsys):
    fused = ["--use_fp8", "--fp8_emulate", "--fp8_path", "fused", "--fp8_scaling", "delayed"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run([*base, *fused, "--max_steps", "8", "--out_dir", straight], capsys)[0] == 0
    records = read_metrics(straight / "metrics.jsonl")
    assert all(isinstance(r["fp8_saturated"], int) for r in records)
    ckpt = load_checkpoint(straight / "checkpoint.pt", restore_rng=False)
    assert ckpt["extra"]["fp8_scaling"]["cursor"] == 8 % 16
    # The first half stops at step 4 on the whole run's schedule, as an interrupted run would.
    assert run([*base, *fused, "--max_steps", "4", "--lr_decay_steps", "8", "--out_dir", split], capsys)[0] == 0
    assert run(["--resume", "--out_dir", split, "--max_steps", "8"], capsys)[0] == 0
    resumed = read_metrics(split / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in resumed] == [(r["step"], r["loss"]) for r in records]  # bit for bit


def test_a_checkpoint_written_before_step_tokens_were_kept_rescales_from_its_saved_config(tmp_path, base, capsys):
    # Such a checkpoint's gradient amaxes were recorded at its saved config's tokens per rank and step: resumed at
    # another batch it must rescale them as a checkpoint that kept the count does.
    fused = ["--use_fp8", "--fp8_emulate", "--fp8_path", "fused", "--fp8_scaling", "delayed"]
    kept, old = tmp_path / "kept", tmp_path / "old"
    assert run([*base, *fused, "--max_steps", "4", "--lr_decay_steps", "6", "--out_dir", kept], capsys)[0] == 0
    shutil.copytree(kept, old)
    checkpoint = read_checkpoint(old / CHECKPOINT_NAME)
    del checkpoint["extra"]["fp8_scaling"]["step_tokens"]
    save_torch_file(old / CHECKPOINT_NAME, checkpoint)
    for folder in (kept, old):
        assert run(["--resume", "--out_dir", folder, "--max_steps", "5", "--batch_size", "2"], capsys)[0] == 0
    resumed = [read_checkpoint(folder / CHECKPOINT_NAME)["extra"]["fp8_scaling"] for folder in (kept, old)]
    assert resumed[0]["step_tokens"] == resumed[1]["step_tokens"] == 2 * TINY_MODEL["context_length"]
    assert torch.equal(resumed[0]["history"], resumed[1]["history"])
    assert torch.equal(resumed[0]["scale"], resumed[1]["scale"])


@pytest.mark.parametrize(
    "first, then",
    [
        (["--no_use_fp8"], ["--use_fp8", "--fp8_emulate", "--fp8_path", "fused", "--fp8_scaling", "delayed"]),
        (
            ["--use_fp8", "--fp8_emulate", "--fp8_path", "fused"],
            ["--use_fp8", "--fp8_emulate", "--fp8_path", "torchao"],
        ),
        (["--use_fp8", "--fp8_emulate"], ["--use_fp8", "--fp8_emulate", "--fp8_path", "fused"]),
    ],
)
def test_checkpoints_interchange_with_bf16_and_torchao(tmp_path, base, capsys, first, then):
    out = tmp_path / "run"
    assert run([*base, *first, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    code, _, err = run(["--resume", "--out_dir", out, "--max_steps", "4", *then], capsys)
    assert code == 0, err
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 4 and result["fp8_path"] == ("fused" if "fused" in then else "torchao")


# ---- GPU ----


@pytest.mark.gpu
@pytest.mark.parametrize("scaling, lm_head", [("dynamic", True), ("delayed", False)])
def test_gpu_compiled_fused_run_launches_three_fp8_gemms_per_linear(tmp_path, token_files, capsys, scaling, lm_head):
    from tiny import tiny_flags

    import verify_fp8_compilation

    out = tmp_path / "verify.json"
    # --no_fp8_shape_filter: on a GPU the auto preset (366m) turns the shape rule on; it would skip every tiny linear.
    argv = [*tiny_flags("cuda"), "--steps", "6", *token_files, "--min_speedup", "0", "--fp8_path", "fused"]
    argv += ["--no_fp8_shape_filter"]
    # The head's flag named both ways: the fused path converts the head by default.
    argv += ["--fp8_scaling", scaling, "--json", str(out), "--fp8_lm_head" if lm_head else "--no_fp8_lm_head"]
    assert verify_fp8_compilation.main(argv) == 0, capsys.readouterr().out
    checks = {c["name"]: c for c in json.loads(out.read_text())["checks"]}
    # Three GEMMs per linear, but q/k/v's input gradients run as one GEMM (two fewer per layer), w1/w3's too (one).
    expected = 3 * (15 if lm_head else 14) - 2 * (2 + 1)
    assert checks["fp8_gemms_launched"]["evidence"]["expected"] == expected
    assert checks["fp8_gemms_launched"]["evidence"]["scaled_mm"] >= expected
    assert checks["no_graph_breaks"]["status"] == "PASS"


@pytest.mark.gpu
def test_gpu_fused_linear_matches_bf16():
    torch.manual_seed(0)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(768, 512, device="cuda", dtype=torch.bfloat16) * 0.05
    (y,) = fp8_linears(x, (weight,), (SiteScaling(DTYPES),), record=False)
    assert sqnr_db(x.double() @ weight.double().t(), y) > 25


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_gpu_transpose_kernel_equals_torchs_transpose_compiled_or_not(dtype):
    from cs336_basics.kernels.transpose_triton import transpose

    x = (torch.randn(300, 200, device="cuda") * 50).to(dtype)  # neither side a multiple of the tile
    expected = x.view(torch.uint8).t().contiguous()
    assert torch.equal(transpose(x).view(torch.uint8), expected)
    assert torch.equal(torch.compile(transpose, fullgraph=True)(x).view(torch.uint8), expected)
    assert SiteScaling(DTYPES, delayed=True, device="cuda")._separate_transpose is transpose
    assert SiteScaling(DTYPES, device="cuda")._separate_transpose is None  # dynamic: inductor writes it well


def test_fused_modules_are_not_nn_linear():
    # TorchAO's converter and the filters look for nn.Linear: an FP8 linear must never be converted twice.
    assert not any(issubclass(m, nn.Linear) for m in (Fp8Linear, Fp8SharedInputLinears, Fp8QkvRope, Fp8SwiGLU))
