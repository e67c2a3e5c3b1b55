"""Atomic, exactly-resumable, weights_only-safe checkpoints."""

from __future__ import annotations

import errno
import io
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from cs336_basics.errors import ConfigError, os_reason
from cs336_basics.optim import MasterWeightAdamW
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, checkpoint_file, save_checkpoint
from cs336_basics.training.restore import load_checkpoint


class TinyLM(nn.Module):
    def __init__(self, seed: int = 0, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(seed)
        self.token_embeddings = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8, bias=False)
        self.ln_final = nn.Parameter(torch.ones(8) + 0.1 * torch.randn(8))
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.to(dtype)

    def forward(self, x):
        h = self.proj(self.token_embeddings(x)) * self.ln_final
        return self.lm_head(h)


def train_steps(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, 16, (4, 5), generator=g)
        y = torch.randint(0, 16, (4, 5), generator=g)
        loss = nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step(max_grad_norm=1.0)
        opt.zero_grad()


def make(seed=0, dtype=torch.float32):
    model = TinyLM(seed, dtype)
    return model, MasterWeightAdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)


CONFIG = {"model": {"dim": 8, "n_layers": 1}, "optim": {"lr": 1e-2, "betas": (0.9, 0.95)}, "tag": None}


def test_round_trip_restores_everything(tmp_path):
    model_a, opt_a = make(seed=0)
    train_steps(model_a, opt_a, 3, seed=1)
    sampler_state = {"position": 12345, "rng": np.random.default_rng(7).bit_generator.state}
    path = save_checkpoint(
        tmp_path / "run" / CHECKPOINT_NAME,
        model=model_a,
        optimizer=opt_a,
        step=3,
        config=CONFIG,
        sampler_state=sampler_state,
        extra={"best_val": 2.5, "out": tmp_path},  # a Path is stored as its string
    )
    assert path == tmp_path / "run" / CHECKPOINT_NAME and path.is_file()
    assert checkpoint_file(tmp_path / "run") == path and checkpoint_file(path) == path

    model_b, opt_b = make(seed=99)
    ckpt = load_checkpoint(path, model=model_b, optimizer=opt_b)
    assert ckpt["step"] == 3
    assert ckpt["config"] == CONFIG
    assert ckpt["sampler_state"] == sampler_state
    assert ckpt["extra"] == {"best_val": 2.5, "out": str(tmp_path)}
    assert ckpt["torch_version"] == torch.__version__
    for (n, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    # Training continues identically from the restored state.
    train_steps(model_a, opt_a, 2, seed=5)
    train_steps(model_b, opt_b, 2, seed=5)
    for (n, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_rng_states_are_restored(tmp_path):
    model, opt = make()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    path = save_checkpoint(tmp_path / CHECKPOINT_NAME, model=model, optimizer=opt, step=0, config={})

    def draw():
        return random.random(), np.random.rand(3).tolist(), torch.rand(3), random.gauss(0, 1)

    first = draw()
    draw()  # move every generator further along
    load_checkpoint(path)
    again = draw()
    assert first[0] == again[0] and first[1] == again[1] and first[3] == again[3]
    assert torch.equal(first[2], again[2])

    draw()
    load_checkpoint(path, restore_rng=False)
    assert draw()[0] != first[0]


def test_compiled_model_saves_clean_keys_and_loads_back(tmp_path):
    model, opt = make()
    compiled = torch.compile(model)  # lazy: nothing is compiled until it is called
    assert any("_orig_mod." in k for k in compiled.state_dict())
    path = save_checkpoint(tmp_path / CHECKPOINT_NAME, model=compiled, optimizer=opt, step=1, config={})
    ckpt = torch.load(path, weights_only=True)
    assert list(ckpt["model"]) == list(model.state_dict())
    assert not any("_orig_mod." in k for k in ckpt["model"])

    target, _ = make(seed=5)
    load_checkpoint(path, model=torch.compile(target))
    for (n, a), b in zip(model.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_submodule_compiled_in_place(tmp_path):
    model, opt = make()
    model.proj = torch.compile(model.proj)  # per-block compile leaves `_orig_mod.` inside the keys
    path = save_checkpoint(tmp_path / CHECKPOINT_NAME, model=model, optimizer=None, step=0, config={})
    keys = list(torch.load(path, weights_only=True)["model"])
    assert "proj.weight" in keys and not any("_orig_mod." in k for k in keys)
    target = TinyLM(seed=3)
    target.proj = torch.compile(target.proj)
    load_checkpoint(path, model=target)
    assert torch.equal(target.proj._orig_mod.weight, model.proj._orig_mod.weight)


def test_bf16_checkpoint_resumes_in_fp32_without_losing_precision(tmp_path):
    model_a, opt_a = make(dtype=torch.bfloat16)
    train_steps(model_a, opt_a, 3, seed=1)
    path = save_checkpoint(tmp_path / CHECKPOINT_NAME, model=model_a, optimizer=opt_a, step=3, config={})
    model_b, opt_b = make(seed=4, dtype=torch.float32)
    load_checkpoint(path, model=model_b, optimizer=opt_b)
    for n, p in model_b.named_parameters():
        assert torch.equal(p.detach(), opt_a.master_params()[n]), n


def test_failed_write_leaves_old_checkpoint_and_no_temp_files(tmp_path, monkeypatch):
    model, opt = make()
    path = save_checkpoint(tmp_path / CHECKPOINT_NAME, model=model, optimizer=opt, step=1, config={})
    original = path.read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, model=model, optimizer=opt, step=2, config={})
    assert path.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_NAME]
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1


def test_a_write_torch_save_hides_still_gives_its_reason():
    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):  # the first write fits, the next finds the disk full
            if self.tell_ > 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.tell_ = len(data)
            return len(data)

        tell_ = 0

    with pytest.raises(RuntimeError) as failed:  # torch's own error ("unexpected pos ..."), raised over the OSError
        torch.save({"w": torch.zeros(1000)}, Full())
    assert os_reason(failed.value) == "the disk is full"


def test_unserialisable_config_fails_at_save_time(tmp_path):
    model, opt = make()
    with pytest.raises(TypeError, match=r"config\.callback"):
        save_checkpoint(tmp_path / CHECKPOINT_NAME, model=model, optimizer=opt, step=0, config={"callback": print})
    assert os.listdir(tmp_path) == []


def test_missing_file_is_a_config_error(tmp_path):
    missing = tmp_path / "nope" / CHECKPOINT_NAME
    with pytest.raises(ConfigError, match="no checkpoint file"):
        load_checkpoint(missing)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty", "foreign"])
def test_corrupt_or_foreign_file_is_a_config_error(tmp_path, kind):
    model, opt = make()
    path = tmp_path / CHECKPOINT_NAME
    if kind == "garbage":
        path.write_bytes(os.urandom(256))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        save_checkpoint(path, model=model, optimizer=opt, step=0, config={})
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:  # a valid torch file, but not one of ours
        torch.save({"weights": torch.ones(2)}, path)
    with pytest.raises(ConfigError) as info:
        load_checkpoint(path, model=model, optimizer=opt)
    assert str(path) in str(info.value)


def test_checkpoint_from_another_model_is_a_config_error(tmp_path):
    model, opt = make()
    path = save_checkpoint(tmp_path / CHECKPOINT_NAME, model=model, optimizer=opt, step=0, config={})
    other = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(ConfigError, match="does not fit this model"):
        load_checkpoint(path, model=other)
    wider = TinyLM()
    wider.proj = nn.Linear(8, 8, bias=True)  # an extra key
    with pytest.raises(ConfigError, match=r"proj\.bias"):
        load_checkpoint(path, model=wider)


def test_is_weights_only_loadable(tmp_path):
    model, opt = make(dtype=torch.bfloat16)
    train_steps(model, opt, 1, seed=0)
    path = save_checkpoint(
        Path(tmp_path) / CHECKPOINT_NAME,
        model=model,
        optimizer=opt,
        step=1,
        config=CONFIG,
        sampler_state={"gen": np.random.default_rng(0).bit_generator.state, "arr": np.arange(3)},
    )
    ckpt = torch.load(path, weights_only=True)  # raises if anything unsafe was pickled
    assert ckpt["sampler_state"]["arr"] == [0, 1, 2]
    assert ckpt["model"]["proj.weight"].dtype == torch.bfloat16
    assert ckpt["optimizer"]["master"]["proj.weight"].dtype == torch.float32


def test_a_sharded_checkpoint_replaced_while_it_is_read_is_read_again_from_the_new_one(tmp_path, monkeypatch):
    """A run still training names its next shard folder, then removes the one a reader (export, generate) was reading:
    the read is made again from the folder named now. A failure while the same folder is named is the failure."""
    from cs336_basics.training import sharded_checkpoint as sc

    named = iter(["step-1", "step-2", "step-2"])
    reads = []

    def read(path):
        reads.append(path)
        if len(reads) == 1:
            raise FileNotFoundError("step-1/.metadata")  # removed under the reader
        return {"format": "whole", "step": 2}

    monkeypatch.setattr(sc, "referenced_shards", lambda folder: next(named))
    monkeypatch.setattr(sc, "read_checkpoint", read)
    monkeypatch.setattr(sc, "is_sharded_checkpoint", lambda ckpt: False)
    checkpoint = tmp_path / CHECKPOINT_NAME
    assert sc.read_whole_checkpoint(checkpoint) == {"format": "whole", "step": 2} and len(reads) == 2
    named, reads[:] = iter(["step-1", "step-1"]), []
    with pytest.raises(FileNotFoundError):
        sc.read_whole_checkpoint(checkpoint)
    assert len(reads) == 1
