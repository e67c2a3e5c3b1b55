"""Gradient accumulation under CUDA graphs (training/accumulation.py): the micro-batches' gradients summed outside
the memory a replay rewrites, equal to eager accumulation. The CPU test stands a reused buffer in for the graph's
memory; the GPU test (marked) trains the tiny FP8 model under CUDA graphs against the same without them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import TINY_MODEL

from cs336_basics.build import build
from cs336_basics.config_layers import build_config
from cs336_basics.training.accumulation import GraphGradientAccumulator
from cs336_basics.training.trainer import Trainer


def replay(params, memory, grads) -> None:
    """What a CUDA-graph backward does: writes the gradients into its own memory and hands that memory to `.grad`."""
    for p, slot, grad in zip(params, memory, grads, strict=True):
        if grad is None:
            p.grad = None
        else:
            slot.copy_(grad)
            p.grad = slot


def test_sums_equal_eager_accumulation_though_each_replay_rewrites_the_same_memory():
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(5, dtype=torch.bfloat16)) for _ in range(3)]
    tied = [params[0], params[1], params[2], params[0]]  # a tied weight listed twice is summed once
    memory = [torch.empty(5, dtype=torch.bfloat16) for _ in params]
    accumulator = GraphGradientAccumulator(tied)
    for _step in range(2):  # the sums are reused from step to step, never carried over
        micro = [[torch.randn(5, generator=gen).to(torch.bfloat16) for _ in params] for _ in range(3)]
        micro[0][2] = None  # a parameter the first micro-batch does not reach
        expected = [None] * len(params)
        for grads in micro:  # eager accumulation: .grad += in the gradient's dtype, in order
            pairs = zip(expected, grads, strict=True)
            expected = [e if g is None else (g.clone() if e is None else e + g) for e, g in pairs]
        for i, grads in enumerate(micro):
            replay(params, memory, grads)
            accumulator.take(first=i == 0, last=i == len(micro) - 1)
            if i < len(micro) - 1:
                assert all(p.grad is None for p in params)  # the graph's memory released until the last
        for p, want, slot in zip(params, expected, memory, strict=True):
            assert torch.equal(p.grad, want) and p.grad.data_ptr() != slot.data_ptr()
        # Left in the graph's memory, the last replay's gradients alone would remain: what the test guards against.
        assert not torch.equal(memory[0], expected[0])
        for p in params:
            p.grad = None  # the optimizer's zero_grad(set_to_none=True)


def test_the_sums_are_reduced_once_after_the_last_micro_batch_before_they_become_the_grads():
    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(3)]
    calls = []

    def halve(sums):  # a stand-in for the average over two ranks
        calls.append([s.clone() for s in sums])
        torch._foreach_mul_(sums, 0.5)

    accumulator = GraphGradientAccumulator([params[0], params[1], params[0], params[2]], reduce=halve)
    micro = [[torch.ones(3), torch.full((3,), 2.0), None], [torch.ones(3), torch.full((3,), 2.0), None]]
    for i, grads in enumerate(micro):
        for p, g in zip(params, grads, strict=True):
            p.grad = None if g is None else g.clone()
        accumulator.take(first=i == 0, last=i == len(micro) - 1)
        assert len(calls) == (1 if i == len(micro) - 1 else 0)
    # Once, on the step's sums in the parameters' order (a tied weight once, one never reached left out).
    assert [c.tolist() for c in calls[0]] == [[2.0] * 3, [4.0] * 3]
    assert params[0].grad.tolist() == [1.0] * 3 and params[1].grad.tolist() == [2.0] * 3 and params[2].grad is None


def tiny_cuda_config(tmp_path, mode: str, accum: int):
    train = dict(batch_size=4, gradient_accumulation_steps=accum, max_steps=1, log_every=1, eval_every=0,
                 checkpoint_every=0, out_dir=str(tmp_path / mode), device="cuda", compile_model=True,
                 compile_mode=mode)  # fmt: skip
    # The fused FP8 path (delayed scaling under CUDA graphs) on every tiny linear.
    fp8 = dict(use_fp8=True, fp8_path="fused", fp8_shape_filter=False)
    return build_config({"model": TINY_MODEL, "train": train, "fp8": fp8, "optim": dict(warmup_steps=1)},
                        device_type="cuda")  # fmt: skip


def accumulated_gradients(tmp_path, mode: str, batches, keep_graph_memory: bool = False) -> list[torch.Tensor]:
    built = build(tiny_cuda_config(tmp_path, mode, len(batches)))
    tokens = np.zeros(4000, dtype=np.uint16)
    trainer = Trainer(built.model, built.config, tokens, tokens, built.device, converter=built.converter)
    if keep_graph_memory:  # the Trainer as it was: the gradients left in the graphs' memory
        trainer._graph_gradients = None
    batches = iter(batches)
    trainer.sampler.next_batch = lambda: next(batches)
    seen = []

    def capture(max_grad_norm=None):
        seen.extend(p.grad.float().clone() for p in trainer.model.parameters())
        return torch.zeros((), device="cuda")

    trainer.optimizer.step = capture
    trainer.train_step()
    torch.cuda.synchronize()
    return seen


@pytest.mark.gpu
def test_gpu_cuda_graph_accumulation_equals_accumulation_without_graphs(tmp_path):
    gen = torch.Generator("cuda").manual_seed(0)
    x = torch.randint(0, 64, (3, 4, 17), device="cuda", generator=gen)
    batches = [(b[:, :-1], b[:, 1:]) for b in x]
    graphs = accumulated_gradients(tmp_path, "reduce-overhead", batches)
    torch._dynamo.reset()
    eager = accumulated_gradients(tmp_path, "default", batches)
    for g, e in zip(graphs, eager, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-2, atol=1e-5)
    torch._dynamo.reset()
    try:  # today's overwrite: wrong sums, or torch's error about an overwritten output
        overwritten = accumulated_gradients(tmp_path, "reduce-overhead", batches, keep_graph_memory=True)
    except RuntimeError as exc:
        assert "overwritten" in str(exc)
    else:
        assert any(not torch.allclose(o, e, rtol=1e-2, atol=1e-5) for o, e in zip(overwritten, eager, strict=True))
