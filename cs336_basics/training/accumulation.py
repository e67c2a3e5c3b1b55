"""Gradient accumulation under CUDA graphs.

A compiled backward replayed as a CUDA graph writes each parameter's gradient into memory the graph owns, and
autograd keeps that memory as `.grad`. The next micro-batch's replay writes there again, so torch either fails
("accessing tensor output of CUDAGraphs that has been overwritten") or adds up the wrong gradients
(pytorch/pytorch#169545). Here each micro-batch's gradients leave the graph's memory before the next replay: the
first micro-batch's are copied into buffers of the run's own, the later ones added to them (one multi-tensor launch
each), and after the last micro-batch those buffers are the `.grad`s the optimizer reads. The additions are those
eager accumulation makes (in the gradient's dtype, in micro-batch order), so the sums are eager accumulation's.

Under DDP the same holds for each rank's sums, which DDP's own all-reduce cannot average: it runs inside the last
micro-batch's backward, on that micro-batch's gradients alone (they are taken out of `.grad` before it, and its
buckets hold what the graph wrote). There every micro-batch skips DDP's all-reduce (parallel/wrap.py:gradient_sync)
and the sums are averaged over the ranks once, after the last (`reduce`), as DDP's eager accumulation averages them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class GraphGradientAccumulator:
    """Sums a step's micro-batch gradients outside CUDA-graph memory (one extra gradient copy of memory)."""

    def __init__(
        self, parameters: Iterable[torch.nn.Parameter], reduce: Callable[[list[torch.Tensor]], None] | None = None
    ):
        """`reduce`: averages the step's sums over the ranks in place, after the last micro-batch (DDP's); None in one
        process."""
        unique = {id(p): p for p in parameters if p.requires_grad}  # a tied weight once
        self.params = list(unique.values())
        self._sums: dict[int, torch.Tensor] = {}  # kept from step to step
        self._written: set[int] = set()  # the sums this step has written
        self.reduce = reduce

    @torch.no_grad()
    def take(self, first: bool, last: bool) -> None:
        """After a micro-batch's backward: its gradients into the sums (copied where this step has none yet, added
        where it has), the graph's memory released from `.grad`; on the `last`, the sums (averaged over the ranks by
        `reduce`, if given) become the `.grad`s."""
        if first:
            self._written.clear()
        copy_to, copy_from, add_to, add_from = [], [], [], []
        for p in self.params:
            if p.grad is None:  # not reached by this micro-batch
                continue
            key = id(p)
            if key in self._written:
                add_to.append(self._sums[key])
                add_from.append(p.grad)
            else:
                if key not in self._sums:
                    self._sums[key] = torch.empty_like(p.grad)
                copy_to.append(self._sums[key])
                copy_from.append(p.grad)
                self._written.add(key)
            p.grad = None
        if copy_to:
            torch._foreach_copy_(copy_to, copy_from)
        if add_to:
            torch._foreach_add_(add_to, add_from)
        if last:
            written = [p for p in self.params if id(p) in self._written]
            if self.reduce is not None:
                self.reduce([self._sums[id(p)] for p in written])
            for p in written:
                p.grad = self._sums[id(p)]
