"""Can this machine train in FP8? Answered by probing, not by guessing from version strings.

`check_fp8_support` reports facts (GPU, compute capability, torch/torchao versions, whether a real FP8 matmul
runs), probing each device once per process; `require_fp8` turns a user's FP8 request into either a go-ahead or
an error that says what to do instead. Both run in the build stage, before any model is built.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch

from cs336_basics.config import FP8Config
from cs336_basics.errors import ConfigError, NotSupportedHere

# FP8 tensor cores arrived with Ada (sm_89) and Hopper (sm_90); Blackwell (sm_100+) keeps them.
MIN_FP8_CAPABILITY = (8, 9)
TORCHAO_INSTALL_HINT = "`uv sync` installs torchao>=0.18 (or `pip install torchao>=0.18`)"
HF_INSTALL_HINT = "install the hf extra: uv sync --extra hf"  # transformers and accelerate (pyproject.toml)


@dataclass(frozen=True)
class FP8Support:
    device: str  # GPU name, or "cpu"
    device_type: str  # "cuda" or "cpu"
    capability: tuple[int, int] | None
    torch_version: str
    torchao_version: str | None
    torchao_ok: bool
    capability_ok: bool
    scaled_mm_ok: bool
    reason: str = ""  # empty when everything is OK, else why FP8 cannot run here
    # Set by require_fp8 for a request that runs but not as the user may assume (e.g. emulation on a GPU).
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.torchao_ok and self.capability_ok and self.scaled_mm_ok

    def format(self) -> str:
        cap = f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "n/a"
        lines = [
            f"FP8 support: {'yes' if self.ok else 'no'}",
            f"  device: {self.device} (compute capability {cap})",
            f"  torch {self.torch_version}, torchao {self.torchao_version or 'not installed'}",
            f"  checks: torchao {_mark(self.torchao_ok)}, sm_89+ {_mark(self.capability_ok)}, "
            f"FP8 _scaled_mm probe {_mark(self.scaled_mm_ok)}",
        ]
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _mark(flag: bool) -> str:
    return "ok" if flag else "FAILED"


def import_torchao() -> Any:
    """Import torchao without the deprecation notice newer torch logs for how torchao registers an enum with
    pytree (torchao 0.18 on torch >= 2.15): it is about torchao's internals and would otherwise top every run."""
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        import torchao
    finally:
        pytree_log.setLevel(level)
    return torchao


def torchao_version() -> tuple[str | None, str]:
    """(version, "") when torchao imports, else (None, the import error text)."""
    try:
        torchao = import_torchao()
    except Exception as exc:  # noqa: BLE001 - a broken install raises more than ImportError
        return None, f"{type(exc).__name__}: {exc}"
    return str(getattr(torchao, "__version__", "unknown")), ""


def _probe_scaled_mm(device: torch.device) -> str:
    """Run one tiny FP8 matmul on `device`; returns "" if it ran and gave the right answer, else the error.

    A capability number says what the silicon could do; only running `torch._scaled_mm` shows that this
    torch build, driver and GPU actually do it (e.g. a CPU-only or too-old CUDA build fails here).
    """
    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        a_hp = torch.randn(16, 32, generator=gen).to(device)
        b_hp = torch.randn(32, 16, generator=gen).to(device)
        a = a_hp.to(torch.float8_e4m3fn)
        # cuBLASLt's FP8 GEMM wants the second operand column-major.
        b = b_hp.to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.tensor(1.0, device=device, dtype=torch.float32)
        out = torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        if isinstance(out, tuple):  # torch < 2.5 returned (out, amax)
            out = out[0]
        ref = a.float() @ b.float()
        # Reading the result synchronises, so an asynchronous kernel failure surfaces inside this try.
        if not torch.isfinite(out).all() or not torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-1):
            return "torch._scaled_mm ran but returned wrong values"
    except Exception as exc:  # noqa: BLE001 - any failure means no FP8 here; its text goes to the user
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return ""


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def check_fp8_support(device: torch.device | str | None = None) -> FP8Support:
    """Facts about FP8 training on `device` (default: the current CUDA GPU, else cpu). Never raises.

    Probed once per device and process: the answer cannot change while the process runs."""
    return _check_fp8_support(str(_resolve_device(device)))


@functools.cache
def _check_fp8_support(device_name: str) -> FP8Support:
    device = torch.device(device_name)
    if device.type != "cuda":
        # No FP8 here whatever torchao says, so torchao is not imported (seconds of start-up for nothing): the
        # installed version is read from the package metadata. Emulation imports it when it converts.
        try:
            version = metadata.version("torchao")
        except metadata.PackageNotFoundError:
            version = None
        return FP8Support(
            device="cpu",
            device_type="cpu",
            capability=None,
            torch_version=torch.__version__,
            torchao_version=version,
            torchao_ok=version is not None,
            capability_ok=False,
            scaled_mm_ok=False,
            reason=f"FP8 needs a CUDA GPU with compute capability >= 8.9 (sm_89+); device is {device.type}",
        )
    ao_version, ao_error = torchao_version()
    reasons = [] if ao_version else [f"torchao is not importable ({ao_error}); {TORCHAO_INSTALL_HINT}"]
    common = dict(
        device_type="cuda", torch_version=torch.__version__, torchao_version=ao_version, torchao_ok=bool(ao_version)
    )
    if not torch.cuda.is_available():
        reasons.insert(0, "a CUDA device was asked for but torch.cuda.is_available() is False")
        return FP8Support(
            device=str(device),
            capability=None,
            capability_ok=False,
            scaled_mm_ok=False,
            reason="; ".join(reasons),
            **common,
        )

    name = torch.cuda.get_device_name(device)
    capability = tuple(torch.cuda.get_device_capability(device))
    capability_ok = capability >= MIN_FP8_CAPABILITY
    if not capability_ok:
        reasons.append(
            f"{name} has compute capability {capability[0]}.{capability[1]}; FP8 tensor cores need >= 8.9 "
            "(Ada, Hopper or Blackwell)"
        )
    # Probed even below sm_89: the exact error is useful in a bug report and costs microseconds.
    probe_error = _probe_scaled_mm(device)
    if probe_error:
        reasons.append(f"an FP8 torch._scaled_mm probe on {name} failed: {probe_error}")
    return FP8Support(
        device=name,
        capability=capability,
        capability_ok=capability_ok,
        scaled_mm_ok=not probe_error,
        reason="; ".join(reasons),
        **common,
    )


def require_fp8(cfg: FP8Config, support: FP8Support) -> FP8Support:
    """Check that the FP8 request in `cfg` can be honoured where `support` was probed; raise if not.

    Returns the support report (with a note for runs that work differently from what the flags may suggest).
    With cfg.use_fp8 off nothing is required and the report is returned as is.
    """
    if not cfg.use_fp8:
        return support
    if cfg.fp8_path == "torchao":
        version, error = torchao_version()  # imported now: on CPU the report above only read the package metadata
        if not (support.torchao_ok and version):
            raise NotSupportedHere(
                f"--use_fp8 needs torchao, which is not importable here ({error}). {TORCHAO_INSTALL_HINT}, "
                "--fp8_path fused (this package's FP8 linears), or run without --use_fp8 (BF16)."
            )
    if cfg.fp8_emulate and cfg.fp8_path == "fused":
        if support.device_type == "cuda":
            raise ConfigError(
                "--fp8_emulate with --fp8_path fused: the fused path has no emulation, it runs real FP8 casts and "
                "GEMMs (on a GPU, at full speed). Drop --fp8_emulate, or use --fp8_path torchao to emulate."
            )
        return dataclasses.replace(
            support, note="--fp8_emulate --fp8_path fused: the FP8 casts and GEMMs run on the CPU, for numerics only."
        )
    if cfg.fp8_emulate:
        # Emulation runs FP8 numerics with ordinary matmuls, so it needs no FP8 hardware at all.
        if support.device_type == "cuda":
            return dataclasses.replace(
                support,
                note="--fp8_emulate on a GPU: FP8 rounding is emulated with high-precision matmuls, so no FP8 "
                "tensor cores are used and it is slower than BF16; drop --fp8_emulate for real FP8 speed.",
            )
        return dataclasses.replace(
            support, note="--fp8_emulate: FP8 numerics emulated on CPU, for numerics tests only (slow)."
        )
    if support.device_type != "cuda":
        raise NotSupportedHere(
            "FP8 needs an H100-class GPU (sm_89+); on CPU use --fp8_emulate for numerics tests only, it is slow. "
            "Or run without --use_fp8."
        )
    return require_fp8_gpu(support)


def require_fp8_gpu(support: FP8Support, emulation: bool = True) -> FP8Support:
    """Check that the CUDA device `support` was probed on runs FP8 matmuls (torch._scaled_mm); raise if not.
    `emulation`: whether the run could use --fp8_emulate instead (a LoRA run's frozen FP8 base cannot)."""
    if emulation:
        elsewhere = "run on CPU with --fp8_emulate (numerics only)"
    else:
        elsewhere = "run on the CPU with --device cpu (torch's CPU FP8 kernel: slow, for tests)"
    if support.capability is None:
        raise NotSupportedHere(
            "--use_fp8 was asked for on CUDA, but torch sees no CUDA GPU; check the driver and that this torch "
            f"build has CUDA, or {elsewhere}."
        )
    if not support.capability_ok:
        major, minor = support.capability
        raise NotSupportedHere(
            f"FP8 training needs compute capability >= 8.9 (Ada / Hopper / Blackwell), but {support.device} is "
            f"{major}.{minor}. Run without --use_fp8 (BF16 is the fast path on this GPU), or {elsewhere}."
        )
    if not support.scaled_mm_ok:
        raise NotSupportedHere(
            f"{support.reason}. The GPU should support FP8, so this torch build or driver cannot run FP8 matmuls; "
            "reinstall a CUDA 12.x+ build of torch, or run without --use_fp8."
        )
    return support
