"""The training loop: compile, AdamW with fp32 master weights, cosine schedule, accumulation, clipping,
validation, metrics, atomic checkpoints and exact resume.

The Trainer receives a model that is already on its device, in its dtype and (for FP8) already converted:
conversion must happen before compilation, so the Trainer is the one place that compiles.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from cs336_basics.config import RunConfig
from cs336_basics.data import BatchSampler, get_batch
from cs336_basics.errors import ConfigError
from cs336_basics.optim import MasterWeightAdamW, cosine_lr
from cs336_basics.precision import count_float8_linears
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from cs336_basics.training.metrics import MetricsLog, flops_per_token, mfu, peak_flops, plot_loss_curve
from cs336_basics.training.summary import FP8_EAGER_WARNING

# Steps left out of the throughput median after a (re)start: the first compiles, the second still
# allocates optimizer state and settles the caching allocator.
WARMUP_STEPS_EXCLUDED = 2


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite. The last checkpoint on disk predates it and is intact."""


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
    checkpoint_path: str


class StepTimer:
    """Times whole optimizer steps without synchronising: CUDA events on GPU, the host clock on CPU (where
    every op already runs synchronously). Durations are read in bulk at log time."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pending: list[tuple] = []

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, step: int, started) -> None:
        if self.cuda:
            ended = torch.cuda.Event(enable_timing=True)
            ended.record()
            self._pending.append((step, started, ended))
        else:
            self._pending.append((step, started, time.perf_counter()))

    def collect(self) -> list[tuple[int, float]]:
        """(step, seconds) for every step since the last collect; synchronises once on GPU."""
        if self.cuda:
            torch.cuda.synchronize()
            out = [(s, a.elapsed_time(b) / 1e3) for s, a, b in self._pending]
        else:
            out = [(s, b - a) for s, a, b in self._pending]
        self._pending.clear()
        return out


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        config: RunConfig,
        train_data: np.ndarray,
        val_data: np.ndarray,
        device: torch.device,
        log=print,
    ):
        if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
            raise ConfigError(
                "the Trainer compiles the model itself (after any FP8 conversion); pass the uncompiled module."
            )
        self.model = model  # the uncompiled module: checkpoints are saved from and loaded into it
        self.config = config
        self.device = device
        self.out_dir = Path(config.train.out_dir)
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        self.val_data = val_data
        t, o, m = config.train, config.optim, config.model
        self.tokens_per_step = t.batch_size * m.context_length * t.gradient_accumulation_steps

        self.float8_modules = count_float8_linears(model)
        if self.float8_modules and not t.compile_model:
            log(f"WARNING: {FP8_EAGER_WARNING}")
        # Compile after any precision conversion (done by the caller). fullgraph=True: a graph break in the
        # model is a bug we want to hear about, not a silent slowdown.
        self.step_model = torch.compile(model, mode=t.compile_mode, fullgraph=True) if t.compile_model else model
        # BF16 keeps FP32's exponent range and torchao scales FP8 tensors itself, so no loss scaling: no AMP
        # GradScaler here on purpose (only fp16 training would need one).
        self.optimizer = MasterWeightAdamW(
            model.named_parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        self.sampler = BatchSampler(train_data, t.batch_size, m.context_length, device, seed=t.seed)
        self.step = 0
        self.flops_per_token = flops_per_token(m, model.num_parameters(exclude_embeddings=True))
        self.peak_flops = peak_flops(device)
        if t.resume:
            self._resume()

    # ---- checkpoints ----
    def _resume(self) -> None:
        if not self.checkpoint_path.exists():
            raise ConfigError(
                f"--resume was given but {self.checkpoint_path} does not exist; "
                "start without --resume or point --out_dir at the run to continue."
            )
        state = load_checkpoint(self.checkpoint_path, model=self.model, optimizer=self.optimizer)
        self.step = state["step"]
        self.sampler.load_state_dict(state["sampler_state"])

    def save(self) -> Path:
        return save_checkpoint(
            self.checkpoint_path,
            model=self.model,
            optimizer=self.optimizer,
            step=self.step,
            config=self.config.to_dict(),
            sampler_state=self.sampler.state_dict(),
        )

    # ---- one optimizer step ----
    def _set_lr(self) -> float:
        o = self.config.optim
        lr = cosine_lr(self.step, o.lr, o.min_lr, o.warmup_steps, self.config.train.max_steps)
        self.optimizer.set_lr(lr)
        return lr

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward, backward and update for one global batch. Returns (mean loss, grad norm) as device
        tensors: nothing here waits for the GPU."""
        accum = self.config.train.gradient_accumulation_steps
        total = torch.zeros((), device=self.device, dtype=torch.float32)
        for _ in range(accum):
            x, y = self.sampler.next_batch()
            loss = self.step_model(x, targets=y)
            (loss / accum).backward()
            total += loss.detach().float()
        grad_norm = self.optimizer.step(max_grad_norm=self.config.optim.max_grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return total / accum, grad_norm

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over fixed validation windows (the same ones every time, so evals are comparable).
        Runs the uncompiled model: a second compiled graph for no-grad mode would cost another compile."""
        t = self.config.train
        rng = np.random.default_rng(t.seed + 1)
        self.model.eval()
        losses = [
            self.model(*get_batch(self.val_data, t.batch_size, self.config.model.context_length, self.device, rng))
            for _ in range(t.eval_batches)
        ]
        self.model.train()
        return torch.stack(losses).float().mean().item()

    # ---- the loop ----
    def train(self) -> TrainResult:
        t = self.config.train
        self.out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path = self.out_dir / "metrics.jsonl"
        log = MetricsLog(metrics_path, resume_from_step=self.step if t.resume else None)
        timer = StepTimer(self.device)
        on_cuda = self.device.type == "cuda"
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

        first_step = self.step
        step_times: list[float] = []
        interval_times: list[float] = []
        compile_s = None
        train_peak_bytes = 0
        loss_sum = torch.zeros((), device=self.device)
        loss_count = 0
        last_loss = float("nan")
        val_loss = None
        # First step whose loss was not finite, tracked on the device so no step has to synchronise.
        first_bad_step = torch.full((), -1, device=self.device, dtype=torch.long)

        self.model.train()
        bar = tqdm(total=t.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True)
        try:
            while self.step < t.max_steps:
                lr = self._set_lr()
                wall0 = time.perf_counter()
                started = timer.start()
                loss, grad_norm = self.train_step()
                timer.stop(self.step, started)
                if self.step == first_step and t.compile_model:
                    loss.item()  # the first step compiles; wait for it so its time is reported apart
                    compile_s = time.perf_counter() - wall0
                bad = ~torch.isfinite(loss)
                first_bad_step = torch.where(bad & (first_bad_step < 0), self.step, first_bad_step)
                loss_sum += loss
                loss_count += 1
                self.step += 1

                is_last = self.step == t.max_steps
                do_eval = t.eval_every > 0 and (self.step % t.eval_every == 0 or is_last)
                do_ckpt = t.checkpoint_every > 0 and (is_last or self.step % t.checkpoint_every == 0)
                if self.step % t.log_every and not (do_eval or do_ckpt):
                    bar.update(1)
                    continue

                # ---- log point: the only place the host waits for the device ----
                for step, seconds in timer.collect():
                    interval_times.append(seconds)
                    if step >= first_step + WARMUP_STEPS_EXCLUDED:
                        step_times.append(seconds)
                self._raise_if_diverged(int(first_bad_step.item()))
                last_loss = (loss_sum / loss_count).item()
                loss_sum.zero_()
                loss_count = 0
                tok_s = self.tokens_per_step / statistics.median(interval_times)
                interval_times.clear()
                if on_cuda:
                    train_peak_bytes = max(train_peak_bytes, torch.cuda.max_memory_allocated(self.device))
                record = {
                    "step": self.step,
                    "tokens": self.step * self.tokens_per_step,
                    "loss": last_loss,
                    "val_loss": None,
                    "lr": lr,
                    "grad_norm": grad_norm.item(),
                    "tokens_per_sec": tok_s,
                    "mfu": mfu(tok_s, self.flops_per_token, self.peak_flops),
                    "peak_mem_gib": train_peak_bytes / 2**30 if on_cuda else None,
                }
                if do_eval:
                    val_loss = self.evaluate()
                    record["val_loss"] = val_loss
                    if on_cuda:  # keep eval's activations out of the training peak
                        torch.cuda.reset_peak_memory_stats(self.device)
                log.write(record)
                bar.set_postfix(self._postfix(record), refresh=False)
                bar.update(1)
                if do_ckpt:
                    self.save()
        except KeyboardInterrupt:
            # Keep the work done so far, unless it already diverged (then the older checkpoint is the good one).
            if int(first_bad_step.item()) < 0:
                self.save()
                raise KeyboardInterrupt(f"interrupted at step {self.step}; saved {self.checkpoint_path}") from None
            raise
        finally:
            bar.close()
            log.close()

        plot_path = plot_loss_curve(metrics_path, self.out_dir / "loss_curve.png", title=str(self.out_dir.name))
        tok_s = self.tokens_per_step / statistics.median(step_times) if step_times else None
        return TrainResult(
            steps=self.step,
            tokens=self.step * self.tokens_per_step,
            loss=last_loss,
            val_loss=val_loss,
            tokens_per_sec=tok_s,
            mfu=mfu(tok_s, self.flops_per_token, self.peak_flops) if tok_s else None,
            peak_mem_gib=train_peak_bytes / 2**30 if on_cuda else None,
            compile_s=compile_s,
            metrics_path=str(metrics_path),
            plot_path=str(plot_path),
            checkpoint_path=str(self.checkpoint_path),
        )

    def _raise_if_diverged(self, bad_step: int) -> None:
        if bad_step < 0:
            return
        kept = (
            f"The last good checkpoint, {self.checkpoint_path}, is intact."
            if self.checkpoint_path.exists()
            else "No checkpoint had been written yet."
        )
        raise TrainingDiverged(
            f"loss became NaN/inf at step {bad_step}. {kept} Try a lower --lr, a longer --warmup_steps "
            f"(now {self.config.optim.warmup_steps}) or a smaller --max_grad_norm."
        )

    @staticmethod
    def _postfix(record: dict) -> dict:
        postfix = {"loss": f"{record['loss']:.3f}", "tok/s": f"{record['tokens_per_sec']:,.0f}"}
        if record["mfu"] is not None:
            postfix["mfu"] = f"{100 * record['mfu']:.1f}%"
        if record["val_loss"] is not None:
            postfix["val"] = f"{record['val_loss']:.3f}"
        return postfix
