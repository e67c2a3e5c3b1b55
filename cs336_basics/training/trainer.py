"""The training loop: compile, AdamW with fp32 master weights, cosine schedule, accumulation, clipping,
validation, metrics, checkpoints and exact resume.

The Trainer receives a model that is already on its device, in its dtype and (for FP8) already converted (the
build stage, cs336_basics/build.py): conversion must happen before compilation, so the Trainer is the one place
that compiles. Under torchrun it also parallelizes (DDP or FSDP2, cs336_basics/parallel/), right after compiling;
every rank runs this same loop, rank 0 alone prints and writes the run folder's files, and the ranks
agree (one small all-reduce at log points) on what must be decided together: divergence, stopping, finite state.

What a checkpoint guarantees: it is written only at a step boundary (the data sampler, optimizer and step agree),
only from a finite state (every loss and gradient norm since the start finite, every master weight and moment
finite), and atomically (the previous checkpoint stays until the new one is complete). A resumed run therefore
continues bit for bit where the checkpoint was taken, on the same machine.
"""

from __future__ import annotations

import contextlib
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from cs336_basics.compiled import compiled_submodules, eager, runs_cuda_graphs
from cs336_basics.config import RunConfig
from cs336_basics.data import BatchSampler, get_rank_batch
from cs336_basics.errors import ConfigError, WorkFailed, io_error, writing
from cs336_basics.measure.results import HOST_SERIES
from cs336_basics.measure.timing import StepTimer
from cs336_basics.optim import MasterWeightAdamW, cosine_lr
from cs336_basics.parallel import world as dist
from cs336_basics.parallel.wrap import (
    FSDP,
    SINGLE_PROCESS,
    ParallelPlan,
    compile_for_training,
    gradient_sync,
    graph_accumulation_reduce,
    parallelize,
)
from cs336_basics.precision import NO_CONVERSION, Converter
from cs336_basics.training.accumulation import GraphGradientAccumulator
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, remove_stale_shards, save_checkpoint
from cs336_basics.training.gc_pauses import GcPauses
from cs336_basics.training.metrics import (
    MetricsLog,
    flops_per_token,
    frozen_matmul_parameters,
    mfu,
    peak_flops,
    plot_loss_curve,
)
from cs336_basics.training.restore import restore_checkpoint
from cs336_basics.training.signals import GracefulStop, Interrupted, StopNow

# Steps left out of the throughput median after a (re)start: the first compiles, the second still
# allocates optimizer state and settles the caching allocator.
WARMUP_STEPS_EXCLUDED = 2


def scheduled_lr(config: RunConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based) under config's schedule."""
    o = config.optim
    return cosine_lr(step, o.lr, o.min_lr, o.warmup_steps, o.lr_decay_steps or config.train.max_steps)


def global_batch_tokens(config: RunConfig, world_size: int) -> int:
    """Tokens of one optimizer step: every rank trains on its own batch_size sequences per micro-batch."""
    t = config.train
    return t.batch_size * config.model.context_length * t.gradient_accumulation_steps * world_size


def trained_ranks(checkpoint: dict[str, Any]) -> int | None:
    """The ranks a checkpoint was trained on: recorded with its extras (Trainer.save), or by a sharded checkpoint of
    before that; None for a whole checkpoint of before that."""
    return (checkpoint.get("extra") or {}).get("world_size", checkpoint.get("world_size"))


def _with_step_tokens(scaling_state: dict | None, saved_config: dict) -> dict | None:
    """Delayed scaling's saved state with the tokens per rank and step its gradient amaxes were recorded at. A
    checkpoint written before the state kept them has its saved config's (batch per rank x context x micro-batches),
    the same count, so that a resume at another world size or batch rescales those amaxes all the same."""
    if scaling_state is None or scaling_state.get("step_tokens") is not None:
        return scaling_state
    return {**scaling_state, "step_tokens": global_batch_tokens(RunConfig.from_dict(saved_config), world_size=1)}


class TrainingDiverged(WorkFailed):
    """The loss or the gradient norm became NaN or infinite. No checkpoint is written from such a state."""


@dataclass
class TrainResult:
    steps: int
    tokens: int
    loss: float
    val_loss: float | None
    tokens_per_sec: float | None
    mfu: float | None
    peak_mem_gib: float | None
    compile_s: float | None
    metrics_path: str
    plot_path: str
    checkpoint_path: str | None  # None when the run writes no checkpoints (checkpoint_every 0)
    # The spread of the timed steps' times (tokens_per_sec is from their median): 10th and 90th percentiles, in ms.
    # Apart, they tell slow steps among fast ones (a pause, another process) from every step being slow.
    step_ms_p10: float | None = None
    step_ms_p90: float | None = None
    # Every timed step's time in ms, in order: whether slow steps come in bursts, at a period or at random.
    step_ms: list[float] = field(default_factory=list)
    # The same steps seen from each rank's host (one list per rank, rank 0 first; one list in one process), in ms:
    # its time to queue the step (host_ms: the step's own time where the GPU waits for the host), the CPU time its
    # threads got meanwhile (host_cpu_ms: the loop's, autograd's backward thread and NCCL's; below host_ms where they
    # waited, for a full launch queue or for a core) and the garbage collector's pauses since the step before (gc_ms).
    # Under torchrun every rank waits at each collective for the slowest one's host: these say which rank that was
    # and where its time went.
    host_ms: list[list[float]] = field(default_factory=list)
    host_cpu_ms: list[list[float]] = field(default_factory=list)
    gc_ms: list[list[float]] = field(default_factory=list)


@dataclass
class _Progress:
    """What the loop has measured since it started (the host reads the device only at log points)."""

    first_step: int
    step_times: list[float] = field(default_factory=list)  # per step, after the warm-up steps: the throughput
    interval_times: list[float] = field(default_factory=list)  # per step since the last log point
    # The timed steps' host series (TrainResult's host_ms, host_cpu_ms, gc_ms), this rank's, by name
    host: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in HOST_SERIES})
    compile_s: float | None = None
    peak_bytes: int = 0
    loss: float = float("nan")  # the last log interval's mean
    val_loss: float | None = None


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        config: RunConfig,
        train_data: np.ndarray,
        val_data: np.ndarray,
        device: torch.device,
        log=print,
        resume_state: dict[str, Any] | None = None,
        parallel: ParallelPlan | None = None,
        converter: Converter = NO_CONVERSION,
    ):
        """`resume_state`: a checkpoint read with training.checkpoint.read_checkpoint (the run folder checks it
        fits `config` first); the model, optimizer, step, sampler, RNG and log interval continue from it.
        `parallel`: the data-parallel plan (build.Built.parallel); default one process. `converter`: what converted
        the model's precision (build.Built.converter), whose step hooks the loop calls."""
        if compiled_submodules(model):
            raise ConfigError(
                "the Trainer compiles the model itself (after any FP8 conversion); pass the uncompiled module."
            )
        # The uncompiled module: checkpoints are saved from and loaded into it (under FSDP2, sharded in place).
        self.model = model
        self.config = config
        self.device = device
        self.log = log
        if parallel is None and dist.current_world().world_size > 1:
            # Without the plan each rank would train its own replica, no gradient exchanged: a silent one-process run.
            raise ValueError("the Trainer runs under a process group: pass the run's plan (parallel=built.parallel)")
        self.parallel = parallel if parallel is not None else SINGLE_PROCESS
        self.world = self.parallel.world
        self.out_dir = Path(config.train.out_dir)
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        self.val_data = val_data
        t, o, m = config.train, config.optim, config.model
        self.tokens_per_step = global_batch_tokens(config, self.world.world_size)

        # Compile after any precision conversion (done by the build stage), then parallelize (a no-op on one process):
        # DDP wraps the compiled model, FSDP2 shards the model whose blocks were compiled (parallel/wrap.py says why
        # in this order). fullgraph=True: a graph break in the model is a bug we want to hear about, not a silent
        # slowdown. `step_model` is what the training step calls. The mode, the scope and the wrapper are build.plan's.
        mode, scope, wrapper = t.compile_mode, t.compile_scope, t.compile_wrapper
        if t.compile_model and "auto" in (mode, scope, wrapper):
            raise ConfigError(
                "the Trainer compiles in the mode, scope and wrapper build.plan chose; pass a planned config "
                "(build.build(config).config), not one with --compile_mode, --compile_scope or --compile_wrapper auto."
            )
        compiled = compile_for_training(model, mode, scope, wrapper, device.type) if t.compile_model else model
        # Under CUDA graphs each compiled region replays into memory of its own, which the next step's replay
        # overwrites; with several regions torch cannot tell where a step begins, so each step says so.
        self._marks_steps = runs_cuda_graphs(t.compile_model, mode, device)
        # Under CUDA graphs a replay overwrites the previous micro-batch's gradients: they are summed outside the
        # graphs' memory (training/accumulation.py), and under DDP averaged over the ranks after the last.
        accumulating = self._marks_steps and t.gradient_accumulation_steps > 1
        self._graph_gradients = (
            GraphGradientAccumulator(model.parameters(), reduce=graph_accumulation_reduce(self.parallel))
            if accumulating
            else None
        )
        # Before parallelize, which under FSDP2 with CUDA graphs marks the buffers it sizes static, and before _restore.
        self.converter = converter
        self.converter.prepare(t.batch_size * m.context_length, t.gradient_accumulation_steps)
        self.step_model = parallelize(model, compiled, self.parallel, device)
        # BF16 keeps FP32's exponent range and torchao scales FP8 tensors itself, so no loss scaling: no AMP
        # GradScaler here on purpose (only fp16 training would need one). Under FSDP2 it steps each rank's shards.
        self.optimizer = MasterWeightAdamW(
            model.named_parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        self.sampler = BatchSampler(
            train_data, t.batch_size, m.context_length, device, seed=t.seed, rank=self.world.rank,
            world_size=self.world.world_size,
        )  # fmt: skip
        self.step = 0
        # Counted as trained, and kept in checkpoints: a resumed run may train another global batch.
        self.tokens = 0
        self.saved_step: int | None = None  # the step of the checkpoint on disk that this run knows is good
        self.flops_per_token = flops_per_token(
            m, model.num_parameters(exclude_embeddings=True), frozen_matmul_parameters(model)
        )
        peak = peak_flops(device)
        # Tokens/s counts the global batch, so MFU compares it with the peak of all the run's GPUs.
        self.peak_flops = peak * self.world.world_size if peak is not None else None
        # The current log interval's running loss: part of a checkpoint, so a resumed interval averages the same
        # steps as an uninterrupted one.
        self._loss_sum = torch.zeros((), device=device)
        self._loss_count = 0
        # The first step whose loss or gradient norm was not finite, tracked on the device (no step waits for it).
        self._first_bad_step = torch.full((), -1, device=device, dtype=torch.long)
        if resume_state is not None:
            self._restore(resume_state)

    # ---- checkpoints ----
    def _restore(self, state: dict[str, Any]) -> None:
        restore_checkpoint(state, model=self.model, optimizer=self.optimizer)
        self.step = self.saved_step = state["step"]
        self.sampler.load_state_dict(state["sampler_state"])
        extra = state.get("extra") or {}
        self.tokens = extra.get("tokens")
        if self.tokens is None:
            # A checkpoint written before the count was kept: its steps are taken as all of its saved config's global
            # batch (a change on an earlier resume went unrecorded then). Where it does not record its ranks either,
            # this launch's stand in.
            ranks = trained_ranks(state) or self.world.world_size
            self.tokens = state["step"] * global_batch_tokens(RunConfig.from_dict(state["config"]), ranks)
        interval = extra.get("log_interval")
        if interval:
            self._loss_sum = interval["loss_sum"].to(self.device)
            self._loss_count = interval["count"]
        self.converter.load_state_dict(_with_step_tokens(extra.get("fp8_scaling"), state["config"]))

    def save(self, stop: GracefulStop | None = None) -> Path:
        """Write a checkpoint of the state at this step boundary: only a finite one, atomically."""
        self._raise_if_diverged()
        if not dist.agree_all(self.optimizer.state_is_finite()):  # under FSDP2 each rank sees its shards only
            raise TrainingDiverged(
                f"the weights or optimizer moments became NaN/inf by step {self.step}, so no checkpoint was written. "
                f"{self.kept()} {self._advice()}"
            )
        # The running loss of the interval so far, over all ranks (a copy: the ranks keep summing their own).
        loss_sum = dist.all_reduce_(self._loss_sum.detach().clone(), "avg")
        extra = {"log_interval": {"loss_sum": loss_sum.cpu(), "count": self._loss_count}, "tokens": self.tokens}
        # How it was trained, for a resume's summary: the global batch and the mode it continues from.
        extra |= {"world_size": self.world.world_size, "parallel": self.parallel.mode}
        precision_state = self.converter.state_dict()
        if precision_state is not None:  # the key of checkpoints written before converters: they still resume
            extra["fp8_scaling"] = precision_state
        contents = dict(
            model=self.model,
            optimizer=self.optimizer,
            step=self.step,
            config=self.config.to_dict(),
            sampler_state=self.sampler.state_dict(),  # the same on every rank (get_rank_batch)
            extra=extra,
        )
        with stop.writing() if stop is not None else contextlib.nullcontext():
            try:
                if self.parallel.mode == FSDP:  # every rank writes its shards
                    from cs336_basics.training.sharded_checkpoint import save_sharded

                    save_sharded(self.out_dir, **contents)
                else:  # one process, or DDP: the replicas are identical, rank 0 writes the one file

                    def write() -> None:
                        save_checkpoint(self.checkpoint_path, **contents)
                        remove_stale_shards(self.out_dir)  # those of a sharded checkpoint this run resumed from

                    dist.main_writes(self.world, write, str(self.checkpoint_path))
            except (OSError, RuntimeError) as exc:
                raise io_error(exc, self.checkpoint_path, self.kept()) from exc
            self.saved_step = self.step
        return self.checkpoint_path

    def kept(self) -> str:
        """What of the run is intact on disk, as the sentence that ends an error."""
        if self.saved_step is None:
            return "No checkpoint of this run had been written."
        return f"The checkpoint from step {self.saved_step}, {self.checkpoint_path}, is intact."

    def _advice(self) -> str:
        return (
            f"Try a lower --lr, a longer --warmup_steps (now {self.config.optim.warmup_steps}) or a smaller "
            "--max_grad_norm."
        )

    def _raise_if_diverged(self) -> None:
        if self.world.launched:  # the earliest bad step on any rank, so that every rank stops together
            never = torch.iinfo(torch.long).max
            first = torch.where(self._first_bad_step < 0, never, self._first_bad_step)
            dist.all_reduce_(first, "min")
            self._first_bad_step = torch.where(first == never, -1, first)
        bad_step = int(self._first_bad_step.item())
        if bad_step >= 0:
            raise TrainingDiverged(
                f"the loss or gradient norm became NaN/inf at step {bad_step + 1}. {self.kept()} {self._advice()}"
            )

    # ---- one optimizer step ----
    def _set_lr(self) -> float:
        lr = scheduled_lr(self.config, self.step)
        self.optimizer.set_lr(lr)
        return lr

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, backward and update for one global batch. Returns (mean loss, grad norm) as device
        tensors: nothing here waits for the GPU."""
        accum = self.config.train.gradient_accumulation_steps
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        # Under DDP with CUDA graphs the sums are averaged after the last micro-batch, not by DDP in its backward.
        averaged_after = self._graph_gradients is not None and self._graph_gradients.reduce is not None
        for i in range(accum):
            x, y = self.sampler.next_batch()
            if self._marks_steps:
                torch.compiler.cudagraph_mark_step_begin()
            with gradient_sync(self.step_model, self.parallel, i == accum - 1, averaged_after):
                loss = self.step_model(x, targets=y)
                (loss / accum).backward()
            total += loss.detach().float()
            if self._graph_gradients is not None:
                self._graph_gradients.take(first=i == 0, last=i == accum - 1)
        grad_norm = self.optimizer.step(max_grad_norm=self.config.optim.max_grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.converter.after_optimizer_step()
        return total / accum, grad_norm

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over fixed validation windows (the same ones every time, so evals are comparable), averaged
        over the ranks, each of which evaluates its rows of every global batch. Runs eager (compiled.eager says
        why)."""
        t, w = self.config.train, self.world
        rng = np.random.default_rng(t.seed + 1)
        self.model.eval()
        context = self.config.model.context_length
        batches = (
            get_rank_batch(self.val_data, t.batch_size, context, self.device, rng, w.rank, w.world_size)
            for _ in range(t.eval_batches)
        )
        with eager():
            losses = [self.model(*batch) for batch in batches]
        self.model.train()
        return dist.all_reduce_(torch.stack(losses).float().mean(), "avg").item()

    # ---- the loop ----
    def train(self) -> TrainResult:
        """Train to config.train.max_steps. Raises TrainingDiverged (nothing saved from a non-finite state) or,
        on SIGINT / SIGTERM, Interrupted after saving a checkpoint at the current step boundary."""
        t = self.config.train
        resumed = self.step > 0
        metrics_path = self.out_dir / "metrics.jsonl"
        main = self.world.is_main  # rank 0 alone prints, logs metrics and plots
        metrics = MetricsLog(metrics_path, resume_from_step=self.step if resumed else None) if main else None
        timer = StepTimer(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        progress = _Progress(first_step=self.step)

        self.model.train()
        # Not disable=False on rank 0: that would override $TQDM_DISABLE.
        off = {} if main else {"disable": True}
        bar = tqdm(total=t.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True, **off)
        stopping = False  # a stop signal, agreed by every rank (on one process: seen at once)
        try:
            with (
                GracefulStop(
                    log=self._say(bar) if main else lambda message: None, saves=self.config.train.checkpoint_every > 0
                ) as stop,
                GcPauses() as gc_pauses,
            ):
                while self.step < t.max_steps and not stopping:
                    lr = self._set_lr()
                    grad_norm = self._timed_step(timer, progress, gc_pauses)
                    is_last = self.step == t.max_steps
                    do_eval = t.eval_every > 0 and (self.step % t.eval_every == 0 or is_last)
                    do_ckpt = t.checkpoint_every > 0 and (is_last or self.step % t.checkpoint_every == 0)
                    if self.step % t.log_every and not (is_last or do_eval or do_ckpt):
                        bar.update(1)
                        # Ranks may get a signal at different steps: they agree at the next log point instead.
                        stopping = stop.requested and not self.world.launched
                        continue
                    record = self._log_point(timer, progress, lr, grad_norm, do_eval)
                    if metrics is not None:
                        with writing(metrics_path, self.kept()):
                            metrics.write(record)
                    bar.set_postfix(self._postfix(record), refresh=False)
                    bar.update(1)
                    if do_ckpt:
                        self.save(stop)
                    stopping = dist.agree_any(stop.requested) if self.world.launched else stop.requested
                if stopping and self.step < t.max_steps:
                    self._stop(stop)
        except StopNow as exc:  # a second Ctrl-C: stopped at once, nothing new saved
            raise StopNow(exc.signum, f"{exc} at step {self.step}. {self.kept()}") from None
        finally:
            bar.close()
            if metrics is not None:
                metrics.close()

        plot_path = self.out_dir / "loss_curve.png"
        if main:
            with writing(plot_path, f"{self.kept()} {metrics_path} is complete."):
                plot_loss_curve(metrics_path, plot_path, title=str(self.out_dir.name))
        return self._result(progress, metrics_path, plot_path)

    def _timed_step(self, timer: StepTimer, progress: _Progress, gc_pauses: GcPauses) -> torch.Tensor:
        """One optimizer step, timed on the device and on the host; its loss and finiteness tracked on the device
        (no wait). Returns the gradient norm, a device tensor."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        started = timer.start()
        loss, grad_norm = self.train_step()
        timer.stop(self.step, started)
        wall1, cpu1 = time.perf_counter(), time.process_time()
        seen = (1e3 * (wall1 - wall0), 1e3 * (cpu1 - cpu0), gc_pauses.take_ms())  # in HOST_SERIES' order
        if self.step >= progress.first_step + WARMUP_STEPS_EXCLUDED:
            for name, ms in zip(HOST_SERIES, seen, strict=True):
                progress.host[name].append(round(ms, 3))
        if self.step == progress.first_step and self.config.train.compile_model:
            loss.item()  # the first step compiles; wait for it so its time is reported apart
            progress.compile_s = time.perf_counter() - wall0
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self._first_bad_step = torch.where(bad & (self._first_bad_step < 0), self.step, self._first_bad_step)
        self._loss_sum += loss
        self._loss_count += 1
        self.step += 1
        self.tokens += self.tokens_per_step
        return grad_norm

    def _log_point(
        self, timer: StepTimer, progress: _Progress, lr: float, grad_norm: torch.Tensor, do_eval: bool
    ) -> dict[str, Any]:
        """The only place the host waits for the device: the interval's step times, divergence (agreed by every
        rank), the mean loss, peak memory, and an evaluation when due. Returns the metrics record."""
        for step, seconds in timer.collect():
            progress.interval_times.append(seconds)
            if step >= progress.first_step + WARMUP_STEPS_EXCLUDED:
                progress.step_times.append(seconds)
        self._raise_if_diverged()
        dist.all_reduce_(self._loss_sum, "avg")
        progress.loss = (self._loss_sum / self._loss_count).item()
        self._loss_sum.zero_()
        self._loss_count = 0
        tok_s = self.tokens_per_step / statistics.median(progress.interval_times)
        progress.interval_times.clear()
        on_cuda = self.device.type == "cuda"
        if on_cuda:  # the largest over the ranks: what the run needs of each GPU
            peak_here = dist.reduce_max(torch.cuda.max_memory_allocated(self.device))
            progress.peak_bytes = max(progress.peak_bytes, int(peak_here))
        record = {
            "step": self.step,
            "tokens": self.tokens,
            "loss": progress.loss,
            "val_loss": None,
            "lr": lr,
            "grad_norm": grad_norm.item(),
            "tokens_per_sec": tok_s,
            "mfu": mfu(tok_s, self.flops_per_token, self.peak_flops),
            "peak_mem_gib": progress.peak_bytes / 2**30 if on_cuda else None,
        }
        # Values clamped at the FP8 maximum since the last record (None: the path does not count them).
        saturated = self.converter.take_saturated()
        if saturated is not None:
            record["fp8_saturated"] = saturated
        if do_eval:
            progress.val_loss = record["val_loss"] = self.evaluate()
            if on_cuda:  # keep eval's activations out of the training peak
                torch.cuda.reset_peak_memory_stats(self.device)
        return record

    def _result(self, progress: _Progress, metrics_path: Path, plot_path: Path) -> TrainResult:
        on_cuda = self.device.type == "cuda"
        times = progress.step_times
        tok_s = self.tokens_per_step / statistics.median(times) if times else None
        spread = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 2
        ranks = dist.gather_objects(progress.host)  # one collective for all three series
        return TrainResult(
            steps=self.step,
            tokens=self.tokens,
            loss=progress.loss,
            val_loss=progress.val_loss,
            tokens_per_sec=tok_s,
            mfu=mfu(tok_s, self.flops_per_token, self.peak_flops) if tok_s else None,
            peak_mem_gib=progress.peak_bytes / 2**30 if on_cuda else None,
            compile_s=progress.compile_s,
            metrics_path=str(metrics_path),
            plot_path=str(plot_path),
            checkpoint_path=str(self.checkpoint_path) if self.saved_step is not None else None,
            step_ms_p10=1e3 * spread[0] if spread else None,
            step_ms_p90=1e3 * spread[-1] if spread else None,
            step_ms=[round(1e3 * seconds, 3) for seconds in times],
            **{name: [rank[name] for rank in ranks] for name in HOST_SERIES},
        )

    def _stop(self, stop: GracefulStop) -> None:
        """A stop signal arrived: save at this step boundary (if the run keeps checkpoints), then stop."""
        # Under torchrun a rank may stop because another one got the signal.
        signum = stop.signum if stop.signum is not None else signal.SIGTERM
        name = f"stopped by {signal.Signals(signum).name} at step {self.step}"
        if self.config.train.checkpoint_every == 0:
            raise Interrupted(signum, f"{name}; this run writes no checkpoints (--checkpoint_every 0)")
        if self.saved_step != self.step:
            self.save(stop)
        raise Interrupted(signum, f"{name}; saved {self.checkpoint_path}")

    @staticmethod
    def _say(bar: tqdm):
        # Diagnostics go to stderr, like the progress bar, without breaking its line.
        return lambda message: bar.write(message.strip(), file=sys.stderr)

    @staticmethod
    def _postfix(record: dict) -> dict:
        postfix = {"loss": f"{record['loss']:.3f}", "tok/s": f"{record['tokens_per_sec']:,.0f}"}
        if record["mfu"] is not None:
            postfix["mfu"] = f"{100 * record['mfu']:.1f}%"
        if record["val_loss"] is not None:
            postfix["val"] = f"{record['val_loss']:.3f}"
        return postfix
