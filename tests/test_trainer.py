"""Trainer behaviour that the CLI tests cannot reach directly: accumulation, divergence, compilation."""

import dataclasses

import numpy as np
import pytest
import torch
from tiny import TINY_MODEL

from cs336_basics.config_layers import build_config
from cs336_basics.model import TransformerLM
from cs336_basics.training.restore import load_checkpoint
from cs336_basics.training.trainer import Trainer, TrainingDiverged


def tiny_config(tmp_path, **train):
    defaults = dict(batch_size=4, max_steps=6, log_every=1, eval_every=0, checkpoint_every=2)
    defaults |= dict(out_dir=str(tmp_path), device="cpu", dtype="float32", compile_model=False)
    return build_config(
        {
            "model": TINY_MODEL,
            "train": defaults | train,
            "optim": dict(warmup_steps=1),
        }
    )


def tokens(n=4000, seed=0):
    return np.random.default_rng(seed).integers(0, 64, size=n, dtype=np.uint16)


def make_trainer(cfg, seed=0):
    torch.manual_seed(seed)
    return Trainer(TransformerLM(cfg.model), cfg, tokens(), tokens(seed=1), torch.device("cpu"))


def test_accumulated_micro_batches_equal_one_big_batch(tmp_path):
    big = tiny_config(tmp_path, batch_size=8)
    # A large Adam eps makes the first update a smooth function of the gradient (with eps ~ 0 it is sign(g),
    # which flips on rounding noise for near-zero gradient entries), so parameters can be compared tightly.
    big = dataclasses.replace(big, optim=dataclasses.replace(big.optim, eps=1e-3))
    split = dataclasses.replace(big, train=dataclasses.replace(big.train, batch_size=4, gradient_accumulation_steps=2))
    x = torch.from_numpy(tokens()[: 8 * 17].astype(np.int64)).view(8, 17)
    batch = (x[:, :-1], x[:, 1:])
    halves = iter([(batch[0][:4], batch[1][:4]), (batch[0][4:], batch[1][4:])])

    a, b = make_trainer(big), make_trainer(split)
    a.sampler.next_batch = lambda: batch
    b.sampler.next_batch = lambda: next(halves)
    loss_a, norm_a = a.train_step()
    loss_b, norm_b = b.train_step()
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(norm_a, norm_b)
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        torch.testing.assert_close(pa, pb, msg=name)


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path))
    real_step = trainer.train_step

    def poisoned_step():
        loss, norm = real_step()
        return (loss * float("nan") if trainer.step >= 3 else loss), norm

    trainer.train_step = poisoned_step
    # Steps are counted from 1, as in metrics.jsonl: the fourth step is the first bad one.
    with pytest.raises(TrainingDiverged, match="step 4.*checkpoint from step 2.*intact"):
        trainer.train()
    state = load_checkpoint(tmp_path / "checkpoint.pt", restore_rng=False)
    assert state["step"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path):
    """One compile (inductor on CPU) of the full model, fullgraph: same losses as eager."""
    eager = make_trainer(tiny_config(tmp_path / "eager", max_steps=3))
    compiled = make_trainer(tiny_config(tmp_path / "compiled", max_steps=3, compile_model=True))
    result_eager, result_compiled = eager.train(), compiled.train()
    assert result_compiled.compile_s is not None and result_compiled.compile_s > 0
    assert result_compiled.loss == pytest.approx(result_eager.loss, rel=1e-4)
    # Checkpoints come from the uncompiled module: no "_orig_mod." anywhere.
    keys = load_checkpoint(tmp_path / "compiled" / "checkpoint.pt", restore_rng=False)["model"].keys()
    assert not any("_orig_mod" in k for k in keys)
