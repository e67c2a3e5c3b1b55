"""The course's AdamW (against torch.optim.AdamW and the handout's formula) and checkpoint functions."""

import io
import math

import pytest
import torch
from torch import nn

from cs336_basics import AdamW, TransformerLM, load_checkpoint, save_checkpoint
from cs336_basics.optim import MasterWeightAdamW
from cs336_basics.training import checkpoint as trainer_checkpoint

SETTINGS = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))  # biases and gains are 1-D


def run(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def test_adamw_matches_torch_adamw():
    ours, theirs = small_model(), small_model()
    run(ours, AdamW(ours.parameters(), **SETTINGS), 30)
    run(theirs, torch.optim.AdamW(theirs.parameters(), **SETTINGS), 30)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert isinstance(AdamW(ours.parameters()), torch.optim.Optimizer)


def test_adamw_param_groups_and_skipped_params():
    ours, theirs = small_model(), small_model()

    def groups(model):
        first, norm, last = model
        return [
            {"params": list(first.parameters()), "lr": 3e-3},
            {"params": list(last.parameters()), "weight_decay": 0.0},
            {"params": list(norm.parameters())},
        ]

    opt_ours, opt_theirs = AdamW(groups(ours), **SETTINGS), torch.optim.AdamW(groups(theirs), **SETTINGS)
    for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
        model[1].weight.requires_grad_(False)  # never gets a gradient: left alone
        run(model, opt, 10)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert torch.equal(ours[1].weight, small_model()[1].weight)


def test_adamw_is_the_handout_algorithm_up_to_eps_placement():
    """The handout writes eps next to sqrt(v) and decays after the Adam step; each step then differs by about
    lr^2 * weight_decay * |adam step| (<= lr^2 * weight_decay * ~1) plus O(eps) terms."""
    model = small_model()
    run(model, AdamW(model.parameters(), **SETTINGS), 20)
    ref = small_model()
    params = [p.detach().double().clone() for p in ref.parameters()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    g = torch.Generator().manual_seed(0)
    lr, (b1, b2), eps, wd = SETTINGS["lr"], SETTINGS["betas"], SETTINGS["eps"], SETTINGS["weight_decay"]
    for t in range(1, 21):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
        with torch.no_grad():
            for p, value in zip(ref.parameters(), params, strict=True):
                p.copy_(value)
        ref.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        for i, p in enumerate(ref.parameters()):
            grad = p.grad.double()
            m[i] = b1 * m[i] + (1 - b1) * grad
            v[i] = b2 * v[i] + (1 - b2) * grad**2
            alpha = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
            params[i] = params[i] - alpha * m[i] / (v[i].sqrt() + eps)
            params[i] = params[i] - lr * wd * params[i]
    for ours, expected in zip(model.parameters(), params, strict=True):
        torch.testing.assert_close(ours.double(), expected, atol=2 * 20 * lr**2 * wd, rtol=0)


def test_adamw_decays_every_parameter():
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.zeros_like(p)  # no gradient signal: only the decay moves the weights
        opt.step()
    for p, p0 in zip(model.parameters(), before, strict=True):
        torch.testing.assert_close(p, p0 * (1 - 0.1 * 0.5) ** 3)


def test_adamw_state_dict_resumes_exactly_and_loads_torchs():
    model = small_model()
    opt = AdamW(model.parameters(), **SETTINGS)
    run(model, opt, 5)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = small_model(seed=1)
    resumed.load_state_dict(saved["model"])
    resumed_opt = AdamW(resumed.parameters(), lr=1.0)  # hyperparameters come from the state dict
    resumed_opt.load_state_dict(saved["opt"])
    assert resumed_opt.param_groups[0]["lr"] == SETTINGS["lr"]
    run(model, opt, 5, seed=1)
    run(resumed, resumed_opt, 5, seed=1)
    for a, b in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    # The state has torch.optim.AdamW's layout, so torch's state dict loads too.
    theirs = small_model()
    torch_opt = torch.optim.AdamW(theirs.parameters(), **SETTINGS)
    run(theirs, torch_opt, 5)
    switched = AdamW(theirs.parameters(), **SETTINGS)
    switched.load_state_dict(torch_opt.state_dict())
    run(theirs, switched, 5, seed=1)
    for a, b in zip(model.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_adamw_closure_bf16_and_bad_settings():
    model = nn.Linear(4, 2).to(torch.bfloat16)
    opt = AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(3, 4, dtype=torch.bfloat16)

    def closure():
        opt.zero_grad()
        loss = model(x).float().pow(2).mean()
        loss.backward()
        return loss

    before = model.weight.detach().clone()
    loss = opt.step(closure)
    assert loss is not None and not torch.equal(model.weight, before)
    assert model.weight.dtype == torch.bfloat16 and opt.state[model.weight]["exp_avg"].dtype == torch.float32
    for bad in (dict(lr=-1.0), dict(betas=(0.9, 1.0)), dict(eps=-1e-8), dict(weight_decay=-0.1)):
        with pytest.raises(ValueError):
            AdamW(model.parameters(), **bad)


# --- checkpoints -------------------------------------------------------------------------------------------


def lm(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(vocab_size=40, context_length=8, d_model=16, num_layers=1, num_heads=2, d_ff=24,
                         rope_theta=1e4)  # fmt: skip


def train_lm(model, optimizer, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 40, (2, 8), generator=g)
        optimizer.zero_grad()
        model(ids[:, :-1], ids[:, 1:]).backward()
        optimizer.step()


def assert_same_training_state(model_a, opt_a, model_b, opt_b):
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    train_lm(model_a, opt_a, 2, seed=9)
    train_lm(model_b, opt_b, 2, seed=9)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("target", ["path", "str", "bytesio"])
def test_checkpoint_round_trip(tmp_path, target):
    model = lm()
    opt = AdamW(model.parameters(), lr=1e-3)
    train_lm(model, opt, 3)
    out = {"path": tmp_path / "ckpt.pt", "str": str(tmp_path / "ckpt.pt"), "bytesio": io.BytesIO()}[target]
    save_checkpoint(model, opt, 3, out)
    if target == "bytesio":
        out.seek(0)
    other = lm(seed=1)
    other_opt = AdamW(other.parameters(), lr=1e-3)
    assert load_checkpoint(out, other, other_opt) == 3
    assert_same_training_state(model, opt, other, other_opt)


def test_checkpoint_is_the_course_format_both_ways(tmp_path):
    model = lm()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # any torch optimizer
    train_lm(model, opt, 2)
    # Ours, read the way the course's load_checkpoint reads it.
    save_checkpoint(model, opt, 7, tmp_path / "ours.pt")
    raw = torch.load(tmp_path / "ours.pt", weights_only=True)
    assert set(raw) == {"model", "optimizer", "iteration"} and raw["iteration"] == 7
    course_model = lm(seed=1)
    course_opt = torch.optim.AdamW(course_model.parameters(), lr=1e-3)
    course_model.load_state_dict(raw["model"])
    course_opt.load_state_dict(raw["optimizer"])
    assert_same_training_state(model, opt, course_model, course_opt)
    # The course's save_checkpoint (a torch.save of that dict), read by ours.
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": 11}, buffer)
    buffer.seek(0)
    mine = lm(seed=2)
    mine_opt = torch.optim.AdamW(mine.parameters(), lr=1e-3)
    assert load_checkpoint(buffer, mine, mine_opt) == 11
    assert_same_training_state(model, opt, mine, mine_opt)


def test_checkpoint_of_a_compiled_model_has_plain_keys(tmp_path):
    model = lm()
    opt = AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model)  # wrapping only; nothing is compiled until it runs
    save_checkpoint(compiled, opt, 1, tmp_path / "c.pt")
    keys = set(torch.load(tmp_path / "c.pt", weights_only=True)["model"])
    assert keys == set(model.state_dict()) and not any("_orig_mod" in k for k in keys)
    target = lm(seed=1)
    assert load_checkpoint(tmp_path / "c.pt", torch.compile(target), AdamW(target.parameters())) == 1
    for a, b in zip(model.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)


def test_load_checkpoint_reads_a_trainer_checkpoint(tmp_path):
    model = lm()
    opt = MasterWeightAdamW(model.named_parameters(), lr=1e-3, fused=False)
    trainer_checkpoint.save_checkpoint(tmp_path / "checkpoint.pt", model=model, optimizer=opt, step=42, config={})
    other = lm(seed=1)
    other_opt = MasterWeightAdamW(other.named_parameters(), lr=1e-3, fused=False)
    assert load_checkpoint(tmp_path / "checkpoint.pt", other, other_opt) == 42
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


def test_load_checkpoint_rejects_other_files(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(lm().state_dict(), path)  # a bare state dict, not a checkpoint
    with pytest.raises(ValueError, match="lacks"):
        load_checkpoint(path, lm(), AdamW(lm().parameters()))
