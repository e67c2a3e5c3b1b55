"""Trainer behaviour that the CLI tests cannot reach directly: accumulation, divergence, compilation."""

import dataclasses
import errno

import numpy as np
import pytest
import torch
from tiny import TINY_MODEL
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from cs336_basics.build import build
from cs336_basics.compiled import (
    compiled_submodules,
    is_compiled,
    resolve_compile_scope,
    write_shared_fp8_gemm_inputs_once,
)
from cs336_basics.config_layers import build_config
from cs336_basics.errors import ConfigError, RunFolderError
from cs336_basics.model import TransformerLM
from cs336_basics.parallel.world import World
from cs336_basics.precision.fused.linear import fp8_matmul
from cs336_basics.training import trainer as trainer_module
from cs336_basics.training.checkpoint import read_checkpoint
from cs336_basics.training.metrics import read_metrics
from cs336_basics.training.restore import load_checkpoint
from cs336_basics.training.trainer import Trainer, TrainingDiverged


def tiny_config(tmp_path, model=None, **train):
    defaults = dict(batch_size=4, max_steps=6, log_every=1, eval_every=0, checkpoint_every=2)
    # Concrete compile settings, as build.plan leaves them (the Trainer refuses "auto").
    defaults |= dict(out_dir=str(tmp_path), device="cpu", dtype="float32", compile_model=False)
    defaults |= dict(compile_mode="default", compile_scope="blocks", compile_wrapper="python")
    return build_config(
        {
            "model": TINY_MODEL | (model or {}),
            "train": defaults | train,
            "optim": dict(warmup_steps=1),
        }
    )


def tokens(n=4000, seed=0):
    return np.random.default_rng(seed).integers(0, 64, size=n, dtype=np.uint16)


def make_trainer(cfg, seed=0):
    torch.manual_seed(seed)
    return Trainer(TransformerLM(cfg.model), cfg, tokens(), tokens(seed=1), torch.device("cpu"))


def test_a_trainer_under_a_process_group_refuses_to_run_without_its_plan(tmp_path, monkeypatch):
    """Under torchrun a Trainer without the run's parallel plan would train a replica per rank with no gradient
    exchanged: it refuses instead of measuring or training one process per rank."""
    monkeypatch.setattr(trainer_module.dist, "current_world", lambda: World(rank=0, world_size=2, launched=True))
    with pytest.raises(ValueError, match="parallel=built.parallel"):
        make_trainer(tiny_config(tmp_path))


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


@pytest.mark.parametrize("written_before_the_count", [False, True], ids=["counted", "older-checkpoint"])
def test_tokens_are_counted_as_trained_across_a_resume_that_changes_the_batch(tmp_path, written_before_the_count):
    make_trainer(tiny_config(tmp_path, max_steps=4, checkpoint_every=4)).train()  # 4 steps of 4 sequences
    state = read_checkpoint(tmp_path / "checkpoint.pt")
    if written_before_the_count:
        state["extra"].pop("tokens", None)
    bigger = tiny_config(tmp_path, max_steps=6, batch_size=8, gradient_accumulation_steps=2)  # then 2 of 16
    torch.manual_seed(0)
    resumed = Trainer(TransformerLM(bigger.model), bigger, tokens(), tokens(seed=1), torch.device("cpu"),
                      resume_state=state)  # fmt: skip
    result = resumed.train()
    context = bigger.model.context_length
    trained = (4 * 4 + 2 * 16) * context
    assert result.tokens == trained
    assert [r["tokens"] for r in read_metrics(tmp_path / "metrics.jsonl")][3:] == [16 * context, 32 * context, trained]
    assert read_checkpoint(tmp_path / "checkpoint.pt")["extra"]["tokens"] == trained


# What torch.save raises when the file's write fails: its zip writer keeps no errno, and its message names neither.
TORCH_WRITER_FAILURES = [
    "[enforce fail at inline_container.cc:672] . unexpected pos 1497792 vs 1497684",
    "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/3: file write failed",
    "[enforce fail at inline_container.cc:810] . PytorchStreamWriter failed writing central directory for archive "
    "archive: file write failed",
    "[enforce fail at inline_container.cc:790] . PytorchStreamWriter failed writing file data/0.",
]


def _second_checkpoint_fails(monkeypatch, fail):
    real_save, saves = torch.save, []

    def save(obj, f, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            fail()
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("message", TORCH_WRITER_FAILURES, ids=["unexpected-pos", "file", "directory", "short"])
def test_a_full_disk_at_a_checkpoint_says_so_names_the_file_and_what_is_intact(tmp_path, monkeypatch, message):
    def fail():
        raise RuntimeError(message)

    _second_checkpoint_fails(monkeypatch, fail)
    with pytest.raises(RunFolderError) as failed:
        make_trainer(tiny_config(tmp_path, max_steps=4, checkpoint_every=2)).train()
    checkpoint = tmp_path / "checkpoint.pt"
    assert str(failed.value).startswith(f"could not write {checkpoint}: the disk is full")
    assert str(failed.value).endswith(f"The checkpoint from step 2, {checkpoint}, is intact.")
    assert "enforce fail" not in str(failed.value)


def test_a_torch_writer_failure_gives_the_reason_of_the_write_it_replaced(tmp_path, monkeypatch):
    def quota_then_torch_error():
        try:  # torch's writer raises its own error while handling the file's: that one is its context
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError:
            raise RuntimeError(TORCH_WRITER_FAILURES[0])  # noqa: B904 - as torch raises it

    _second_checkpoint_fails(monkeypatch, quota_then_torch_error)
    with pytest.raises(RunFolderError, match="checkpoint.pt: the disk quota is used up. The checkpoint from step 2"):
        make_trainer(tiny_config(tmp_path, max_steps=4, checkpoint_every=2)).train()


def test_a_disk_another_writer_filled_fails_at_the_metrics_line_naming_it(tmp_path, monkeypatch):
    class FillsUp:
        """metrics.jsonl on a disk that fills after its second line: each flush fails from then on, and so does
        close, which flushes the same line again (Python's buffered files keep what they could not write)."""

        def __init__(self, f):
            self.f, self.lines = f, 0

        def write(self, text):
            self.lines += 1
            return self.f.write(text)

        def flush(self):
            if self.lines > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.f.flush()

        def close(self):
            self.flush()

    class Log(trainer_module.MetricsLog):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._file = FillsUp(self._file)

    monkeypatch.setattr(trainer_module, "MetricsLog", Log)
    with pytest.raises(RunFolderError) as failed:
        make_trainer(tiny_config(tmp_path, max_steps=4, checkpoint_every=2)).train()
    metrics = tmp_path / "metrics.jsonl"
    assert str(failed.value) == (
        f"could not write {metrics}: the disk is full. The checkpoint from step 2, {tmp_path / 'checkpoint.pt'}, "
        "is intact."
    )


def test_a_model_the_trainer_compiled_is_refused_by_the_next_trainer(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, compile_model=True))  # compiles nothing until a step runs
    assert compiled_submodules(trainer.model) == ["<the model itself>", "token_embeddings", "layers.0", "layers.1"]
    with pytest.raises(ConfigError, match="pass the uncompiled module"):
        Trainer(trainer.model, trainer.config, tokens(), tokens(seed=1), torch.device("cpu"))


def test_the_trainer_compiles_as_planned_and_decides_nothing(tmp_path):
    unplanned = tiny_config(tmp_path, compile_model=True, compile_mode="auto")
    with pytest.raises(ConfigError, match="mode, scope and wrapper build.plan chose"):
        make_trainer(unplanned)
    with pytest.raises(ConfigError, match="mode, scope and wrapper build.plan chose"):
        make_trainer(tiny_config(tmp_path, compile_model=True, compile_wrapper="auto"))
    planned = build(unplanned)
    t = planned.config.train
    assert (t.compile_mode, t.compile_scope, t.compile_wrapper) == ("default", "blocks", "python")
    make_trainer(planned.config)


def test_compile_scope_model_compiles_the_whole_model_into_a_wrapper(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, compile_model=True, compile_scope="model"))
    assert is_compiled(trainer.step_model) and compiled_submodules(trainer.model) == []


@pytest.mark.slow  # an inductor compile for the CPU with its caches off: about 36 s on two cores
def test_an_fp8_tensor_that_several_scaled_gemms_read_is_written_once():
    """What compile_for_training sets up: the FP8 cast that an RMSNorm writes for q, k and v is stored once, not
    once per GEMM (inductor copied it for each `_scaled_mm`)."""
    write_shared_fp8_gemm_inputs_once()

    def qkv(x, gain, scale, one, *weights):
        x_fp8 = (x.float() * gain.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        return [fp8_matmul(x_fp8, one, w.t(), one, fast_accum=False) for w in weights]

    torch.manual_seed(0)
    args = (torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16), torch.tensor(2.0))
    args += (torch.tensor(1.0), *[torch.randn(48, 32).to(torch.float8_e4m3fn) for _ in range(3)])
    with torch._inductor.config.patch(force_disable_caches=True):
        outputs, (code, *_) = run_and_get_code(torch.compile(qkv, fullgraph=True), *args)
    fp8_buffers = [line for line in code.splitlines() if "= empty_strided_" in line and "float8_e4m3fn" in line]
    assert len(fp8_buffers) == 1, fp8_buffers
    assert all(torch.equal(a, b) for a, b in zip(outputs, qkv(*args), strict=True))


def test_compile_scope_resolves_and_refuses_what_cannot_be_honoured():
    assert resolve_compile_scope("auto", own_model=True, fsdp=False)[0] == "blocks"
    assert resolve_compile_scope("auto", own_model=True, fsdp=True)[0] == "blocks"
    assert resolve_compile_scope("auto", own_model=False, fsdp=False)[0] == "model"
    assert resolve_compile_scope("model", own_model=True, fsdp=False) == ("model", "asked for")
    with pytest.raises(ConfigError, match="this package's model only"):
        resolve_compile_scope("blocks", own_model=False, fsdp=False)
    with pytest.raises(ConfigError, match="cannot run under FSDP2"):
        resolve_compile_scope("model", own_model=True, fsdp=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scope", "recompute", "graphs"),
    # By block: the embedding, one graph for the three blocks, the output. The whole model: one graph.
    [("blocks", False, 3), ("blocks", True, 3), ("model", False, 1)],
    ids=["blocks", "blocks-activation-checkpointing", "model"],
)
def test_compiled_training_matches_eager(tmp_path, scope, recompute, graphs):
    """Compiled on CPU (fullgraph), by block (the embedding, each block's forward and the output apart) or whole: the
    same losses as eager, also with activation checkpointing; the three blocks share one compiled graph; evaluation
    compiles nothing."""
    model = dict(n_layers=3, gradient_checkpointing=recompute)
    eager = make_trainer(tiny_config(tmp_path / "eager", model, max_steps=3, eval_every=3))
    train = dict(max_steps=3, eval_every=3, compile_model=True, compile_scope=scope)
    compiled = make_trainer(tiny_config(tmp_path / "compiled", model, **train))
    torch._dynamo.reset()
    counters.clear()
    result_eager, result_compiled = eager.train(), compiled.train()
    assert counters["stats"]["unique_graphs"] == graphs
    assert result_compiled.compile_s is not None and result_compiled.compile_s > 0
    assert result_compiled.loss == pytest.approx(result_eager.loss, rel=1e-4)
    assert result_eager.val_loss is not None
    assert result_compiled.val_loss == pytest.approx(result_eager.val_loss, rel=1e-4)
    # Checkpoints come from the uncompiled module: no "_orig_mod." anywhere.
    keys = load_checkpoint(tmp_path / "compiled" / "checkpoint.pt", restore_rng=False)["model"].keys()
    assert not any("_orig_mod" in k for k in keys)
