"""The sweep's grid and plan: which configurations, in which order (each group's BF16 + compile baseline first),
each with its config built and validated before anything runs. A world size above 1 is a configuration trained by
that many processes under torchrun (one per GPU) with a --parallel mode; world size 1 is one process, as before."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import itertools
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cs336_basics.cli import scalar_type
from cs336_basics.config import PRESETS, SECTIONS, RunConfig, TrainConfig, field_problem
from cs336_basics.config_layers import build_config
from cs336_basics.devices import resolve_device
from cs336_basics.errors import ConfigError, NotSupportedHere
from cs336_basics.parallel.world import World
from cs336_basics.parallel.wrap import DDP, FSDP, NONE, check_parallel_request
from cs336_basics.precision import check_fp8_support, choose_fp8

# fp8: train_h100.py's default FP8 (no FP8 flag but --use_fp8: the path and its settings as precision/choice.py
# chooses them); fp8-<recipe>: TorchAO's path; fp8-fused-<scaling>: this package's (--fp8_path fused);
# fp8-accelerate: Hugging Face Accelerate's conversion (--fp8_path accelerate, tensorwise; the hf extra).
PRECISIONS = (
    "bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise_with_gw_hp", "fp8-fused-dynamic", "fp8-fused-delayed", "fp32",
    "fp8", "fp8-accelerate",
)  # fmt: skip
COMPILE_CHOICES = ("eager", "auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
PARALLEL_CHOICES = (DDP, FSDP)  # for world sizes above 1; one process has none
ON_OFF = {"off": False, "on": True}
DEFAULT_PRESETS = ("366m", "gpt2-small", "1.3b")
DEFAULTS: dict[str, Any] = dict(
    presets=DEFAULT_PRESETS,
    precisions=PRECISIONS[:4],
    # None: as the precision says (fp8-*: off unless +lm_head; fp8: its path's default); --fp8_lm_head off,on sweeps it
    fp8_lm_head=(None,),
    compile=("eager", "default", "max-autotune"),
    attention=("sdpa", "flash"),
    ac=(False, True),
    batch_sizes=None,  # each preset's own batch size
    world_sizes=(1,),
    parallel=PARALLEL_CHOICES,  # multiplies only the world sizes above 1
    steps=30,
    timeout_s=600.0,
)
# --quick: the question most people have (does FP8 pay on this GPU, at the shape we measured?) in a few minutes: two
# configurations, each a process start, a compile and 20 steps, each capped at timeout_s, so a hung compile cannot
# hold the sweep.
QUICK: dict[str, Any] = dict(
    presets=("366m",),
    precisions=("bf16", "fp8"),
    fp8_lm_head=(None,),
    compile=("auto",),  # train_h100.py's default: each side at the mode a user's run would get
    attention=("sdpa",),
    ac=(False,),
    batch_sizes=(8,),
    world_sizes=(1,),
    parallel=PARALLEL_CHOICES,
    steps=20,
    timeout_s=200.0,
)

# LoRA mode (--lora_ranks): each configuration is a BF16 base and an FP8 base measured together, compiled as
# train_h100.py compiles by default (auto), SDPA, without activation checkpointing unless the flags say otherwise (one
# value each).
LORA_DEFAULTS: dict[str, Any] = dict(
    DEFAULTS, presets=("366m", "1.3b"), compile=("auto",), attention=("sdpa",), ac=(False,), steps=12
)

# Settings the sweep itself sets for every configuration: as pass-through flags they would be silently
# overridden, so they are refused with the sweep flag to use instead.
SWEPT_SETTINGS = {
    ("model", "attention"): "--attention",
    ("model", "gradient_checkpointing"): "--ac off,on",
    ("train", "batch_size"): "--batch_sizes",
    ("train", "parallel"): "--parallel ddp,fsdp with --world_sizes 1,2",
    ("train", "max_steps"): "--steps",
    ("train", "compile_model"): "--compile eager,default,...",
    ("train", "compile_mode"): "--compile",
    ("train", "dtype"): "--precisions (bf16 and fp8-* train BF16 weights, fp32 float32)",
    ("train", "out_dir"): "--out_dir (the runs themselves use temporary folders)",
    ("train", "resume"): "nothing (every configuration starts fresh)",
    ("train", "log_every"): "nothing (set from --steps)",
    ("train", "eval_every"): "nothing (benchmarks do not evaluate)",
    ("train", "checkpoint_every"): "nothing (benchmarks write no checkpoints)",
    ("fp8", "use_fp8"): "--precisions",
    ("fp8", "fp8_recipe"): "--precisions fp8-tensorwise,fp8-rowwise,...",
    ("fp8", "fp8_path"): "--precisions fp8-fused-dynamic,fp8-fused-delayed (this package's path)",
    ("fp8", "fp8_scaling"): "--precisions fp8-fused-dynamic,fp8-fused-delayed",
    ("fp8", "fp8_lm_head"): "--fp8_lm_head off,on",
}

BASELINE_PRECISION, BASELINE_COMPILE = "bf16", "default"


LM_HEAD_SUFFIX = "+lm_head"  # an FP8 precision with the lm_head converted too, e.g. fp8-fused-dynamic+lm_head
# Not fp8-accelerate: Accelerate's own filter keeps the lm_head (the last linear) in BF16.
WITH_LM_HEAD = tuple(p + LM_HEAD_SUFFIX for p in PRECISIONS if p.startswith("fp8") and p != "fp8-accelerate")


def precision_settings(precision: str) -> dict[str, dict[str, Any]]:
    """The config settings (by section) that one of PRECISIONS (or WITH_LM_HEAD) stands for."""
    fp8: dict[str, Any] = {"use_fp8": precision.startswith("fp8")}
    if precision.startswith("fp8-"):  # a named variant: the lm_head in FP8 only where its name says +lm_head
        fp8["fp8_lm_head"] = precision.endswith(LM_HEAD_SUFFIX)
    precision = precision.removesuffix(LM_HEAD_SUFFIX)
    if precision.startswith("fp8-fused-"):
        fp8.update(fp8_path="fused", fp8_recipe="tensorwise", fp8_scaling=precision.removeprefix("fp8-fused-"))
    elif precision == "fp8-accelerate":
        fp8.update(fp8_path="accelerate", fp8_recipe="tensorwise")
    elif precision.startswith("fp8-"):
        fp8.update(fp8_path="torchao", fp8_recipe=precision.removeprefix("fp8-"))
    return {"fp8": fp8, "train": {"dtype": "float32" if precision == "fp32" else "bfloat16"}}


# ---- the grid ----

# One --vary setting of a configuration: (config section, setting name, value).
Setting = tuple[str, str, Any]


def varied_label(variant: Sequence[Setting]) -> str | None:
    """The --vary settings of a configuration as its label and records name them, e.g. "ddp_bucket_mb=100"."""
    shown = lambda value: on_off(value) if isinstance(value, bool) else str(value)  # noqa: E731
    return ",".join(f"{name}={shown(value)}" for _, name, value in variant) or None


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the grid."""

    preset: str
    batch_size: int
    precision: str
    fp8_lm_head: bool | None  # None: the FP8 path's default
    compile: str  # "eager" or a torch.compile mode
    attention: str
    ac: bool
    world_size: int = 1  # processes (GPUs), launched by torchrun when above 1
    parallel: str = NONE  # ddp or fsdp when world_size > 1
    variant: tuple[Setting, ...] = ()  # its --vary settings

    @property
    def is_fp8(self) -> bool:
        return self.precision.startswith("fp8")

    @property
    def is_baseline(self) -> bool:
        # compile auto gives a BF16 step the default mode (compiled.auto_compile_mode), which its record then names
        return self.precision == BASELINE_PRECISION and self.compile in (BASELINE_COMPILE, "auto")

    @property
    def varied(self) -> str | None:
        return varied_label(self.variant)

    @property
    def label(self) -> str:
        precision = self.precision + (LM_HEAD_SUFFIX if self.fp8_lm_head else "")
        label = f"{self.preset}/bs{self.batch_size}/{precision}/{self.compile}/{self.attention}/ac-{on_off(self.ac)}"
        label += f"/{self.parallel}-x{self.world_size}" if self.world_size > 1 else ""
        return label + (f"/{self.varied}" if self.variant else "")

    def overrides(self, base: dict[str, Any], steps: int) -> dict[str, Any]:
        """config.build_config overrides for this point: the pass-through settings plus the swept ones."""
        values = copy.deepcopy(base)
        values["preset"] = self.preset
        values.setdefault("model", {}).update(attention=self.attention, gradient_checkpointing=self.ac)
        values.setdefault("train", {}).update(
            batch_size=self.batch_size,
            max_steps=steps,
            log_every=log_every_for(steps),
            eval_every=0,
            checkpoint_every=0,
            resume=False,
            compile_model=self.compile != "eager",
            compile_mode=BASELINE_COMPILE if self.compile == "eager" else self.compile,
            parallel=self.parallel if self.world_size > 1 else "auto",  # auto: none in one process
            **precision_settings(self.precision)["train"],
        )
        values.setdefault("fp8", {}).update(precision_settings(self.precision)["fp8"])
        if self.fp8_lm_head is not None:
            values["fp8"]["fp8_lm_head"] = self.fp8_lm_head
        for section, name, value in self.variant:  # never a setting the sweep sets (parse_variants refuses those)
            values.setdefault(section, {})[name] = value
        return values


@dataclass(frozen=True)
class Grid:
    presets: tuple[str, ...]
    precisions: tuple[str, ...]
    fp8_lm_head: tuple[bool | None, ...]
    compile: tuple[str, ...]
    attention: tuple[str, ...]
    ac: tuple[bool, ...]
    batch_sizes: tuple[int, ...] | None  # None: each preset's own batch size
    world_sizes: tuple[int, ...] = (1,)
    parallel: tuple[str, ...] = PARALLEL_CHOICES  # for the world sizes above 1
    variants: tuple[tuple[Setting, ...], ...] = ((),)  # --vary: every combination of the settings' values


def on_off(flag: bool) -> str:
    return "on" if flag else "off"


def log_every_for(steps: int) -> int:
    """Log (the Trainer's only sync point) every 5-10 steps, on a divisor of `steps` so the last step is a log
    point: its timings are collected and `loss` is the mean over the last interval, not the whole run."""
    return next((d for d in range(10, 4, -1) if steps % d == 0), steps)


def preset_batch_size(preset: str) -> int:
    return PRESETS[preset].get("train", {}).get("batch_size", TrainConfig.batch_size)


def placements(grid: Grid) -> list[tuple[int, str]]:
    """(world size, parallel mode) pairs: one process without a mode, each larger world size with each mode."""
    return [(n, mode) for n in grid.world_sizes for mode in ((NONE,) if n == 1 else grid.parallel)]


def expand_grid(grid: Grid) -> list[SweepPoint]:
    """Every combination, grouped by (preset, batch, attention, AC, world size, parallel mode, --vary settings) with
    the group's BF16 + compile(default) baseline first. fp8_lm_head only multiplies the FP8 precisions (it means
    nothing without FP8); the parallel modes only the world sizes above 1."""
    points = []
    for preset in grid.presets:
        for batch in grid.batch_sizes or (preset_batch_size(preset),):
            axes = itertools.product(grid.attention, grid.ac, placements(grid), grid.variants)
            for attention, ac, (world, parallel), variant in axes:
                group = [
                    SweepPoint(preset, batch, precision, lm_head, mode, attention, ac, world, parallel, variant)
                    for mode in grid.compile
                    for precision in grid.precisions
                    for lm_head in (grid.fp8_lm_head if precision.startswith("fp8") else (None,))
                ]
                points += sorted(group, key=lambda p: not p.is_baseline)  # stable: the baseline moves first
    return points


def parse_choices(text: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    """A comma-separated subset of `allowed`, in the given order, duplicates dropped."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{flag} is empty; give a comma-separated list from: {', '.join(allowed)}.")
    bad = [item for item in items if item not in allowed]
    if bad:
        raise ConfigError(f"{flag}: unknown value(s) {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}.")
    return tuple(dict.fromkeys(items))


def parse_on_off(text: str, flag: str) -> tuple[bool, ...]:
    return tuple(ON_OFF[item] for item in parse_choices(text, tuple(ON_OFF), flag))


def parse_positive_ints(text: str, flag: str, example: str) -> tuple[int, ...]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        sizes = [int(item) for item in items]
    except ValueError:
        sizes = []
    if not items or len(sizes) != len(items) or min(sizes) < 1:
        raise ConfigError(f"{flag} must be comma-separated positive integers (e.g. {example}), got {text!r}.")
    return tuple(dict.fromkeys(sizes))


def parse_variants(items: Sequence[str], base: dict[str, Any]) -> tuple[tuple[Setting, ...], ...]:
    """--vary SETTING=A,B, once per setting: every combination of their values, each a configuration's settings. A
    SETTING is any train_h100.py setting (on/off for a switch) that the sweep does not set itself and that `base`
    (the settings given for every configuration) does not hold."""
    axes: dict[str, tuple[Setting, ...]] = {}
    for item in items:
        name, _, text = (part.strip() for part in item.partition("="))
        section, scalar, field = _setting_field(name, item)
        if (section, name) in SWEPT_SETTINGS:
            instead = SWEPT_SETTINGS[section, name]
            raise ConfigError(f"--vary {item}: --{name} is set per configuration by the sweep; use {instead}.")
        if name in base.get(section, {}):
            raise ConfigError(f"--{name} is given for every configuration and as --vary {item}: pass one of them.")
        if name in axes:
            raise ConfigError(f"--vary {name} is given twice: list its values in one --vary {name}=A,B.")
        texts = [value.strip() for value in text.split(",") if value.strip()]
        if not texts:
            raise ConfigError(f"--vary takes SETTING=VALUE,VALUE (e.g. ddp_bucket_mb=25,100), got {item!r}.")
        values = [_setting_value(value, scalar, field, name) for value in texts]
        axes[name] = tuple((section, name, value) for value in dict.fromkeys(values))
    return tuple(itertools.product(*axes.values()))


def _setting_field(name: str, item: str) -> tuple[str, type, dataclasses.Field]:
    """The config section of setting `name`, its value type and its field."""
    for section, cls in SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name in fields:
            scalar = scalar_type(typing.get_type_hints(cls)[name])
            return section, scalar, fields[name]
    raise ConfigError(f"--vary {item}: {name!r} is no train_h100.py setting (see train_h100.py --help).")


def _setting_value(text: str, scalar: type, field: dataclasses.Field, name: str) -> Any:
    if scalar is bool:
        if text not in ON_OFF:
            raise ConfigError(f"--vary {name}: a switch takes on or off, got {text!r}.")
        return ON_OFF[text]
    try:
        value = scalar(text)
    except ValueError:
        raise ConfigError(f"--vary {name}: {text!r} is not a {scalar.__name__}.") from None
    problem = field_problem(field, value)  # the setting's own rule, as every configuration's config checks it
    if problem:
        raise ConfigError(f"--vary {name}: {problem}; got {text!r}.")
    return value


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    return parse_positive_ints(text, "--batch_sizes", "4,8")


def parse_world_sizes(text: str) -> tuple[int, ...]:
    return parse_positive_ints(text, "--world_sizes", "1,2")


# ---- the plan: points with their validated configs ----


@dataclass(frozen=True)
class Planned:
    point: SweepPoint
    overrides: dict[str, Any]
    from_file: dict[str, Any]
    config: RunConfig  # built here, so a bad pass-through setting fails before the sweep starts
    skip: str | None = None  # why this machine cannot run it, known before any run: then no worker is started

    @property
    def spec(self) -> dict[str, Any]:
        """What the worker gets: it rebuilds the same config with config.build_config."""
        extra = {"label": self.point.label}
        if self.point.variant:  # the records name what they vary (sweep/report.py groups by it)
            extra["varied"] = self.point.varied
        return {"overrides": self.overrides, "from_file": self.from_file, "extra": extra}


@dataclass
class SweepOptions:
    grid: Grid
    steps: int
    timeout_s: float
    out_dir: Path | None  # None: the dated default
    base_overrides: dict[str, Any]
    from_file: dict[str, Any]
    quick: bool
    dry_run: bool
    amdahl: bool = False
    lora_ranks: tuple[int, ...] = ()  # LoRA mode when set (sweep/lora.py)
    lora_targets: tuple[str, ...] = ("attn",)
    repeats: int = 1  # fresh processes per configuration; its row is their median run (sweep/report.py)
    cold: bool = False  # each of them with empty compile caches: a user's first run


def plan_sweep(options: SweepOptions) -> list[Planned]:
    plan = []
    for point in expand_grid(options.grid):
        overrides = point.overrides(options.base_overrides, options.steps)
        config = build_config(overrides, options.from_file)
        skip = None
        try:
            device = resolve_device(config.train.device)
        except NotSupportedHere:  # a device this machine lacks: every run would be skipped, so none is started
            if not options.dry_run:  # (a plan may be printed anywhere)
                raise
        else:
            # Off a GPU, FP8 runs only emulated. (On one, the workers probe it: a probe here would hold a CUDA
            # context on the GPU beside them for the whole sweep.)
            if device.type != "cuda" and config.fp8.use_fp8 and not config.fp8.fp8_emulate:
                reason = check_fp8_support(device).reason
                skip = f"FP8 does not run here ({reason}); drop fp8 from --precisions on this machine"
        # What the ranks would refuse (e.g. the fused path's FP8 all-gather under FSDP2), before any run.
        try:
            if point.world_size > 1:
                check_parallel_request(config, World(world_size=point.world_size, launched=True))
            choose_fp8(config.fp8, world_size=point.world_size, lora=config.finetune.lora)
        except ConfigError as exc:
            raise ConfigError(f"{point.label}: {exc} (narrow --precisions or --parallel)") from exc
        plan.append(Planned(point, overrides, options.from_file, config, skip))
    return plan


LORA_PASS_THROUGH = {("fp8", "fp8_path"), ("fp8", "fp8_scaling")}


def check_pass_through(overrides: dict[str, Any], lora: bool = False, source: str | None = None) -> None:
    """Refuse pass-through settings the sweep sets itself: flags, or with `source` those of that --config file. In
    LoRA mode, which sweeps no precisions, --fp8_path and --fp8_scaling pass (the frozen base runs its own FP8 linears
    either way; `--fp8_path fused` unlocks the fused path's switches, e.g. --fp8_fast_accum_backward and
    --fp8_scaling delayed)."""
    where = lambda name: f"{source}: its {name}" if source else f"--{name}"  # noqa: E731
    if "preset" in overrides:
        raise ConfigError(f"{where('preset')} is set per configuration by the sweep; use --presets (comma-separated).")
    for (section, name), instead in SWEPT_SETTINGS.items():
        if lora and (section, name) in LORA_PASS_THROUGH:
            continue
        if name in overrides.get(section, {}):
            raise ConfigError(f"{where(name)} is set per configuration by the sweep; use {instead}.")


def gpu_slug(gpu_name: str | None) -> str:
    """For file names: "NVIDIA H100 80GB HBM3" -> "h100"; an unknown GPU -> its name as a slug; none -> "cpu"."""
    if not gpu_name:
        return "cpu"
    known = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", gpu_name)
    if known:
        return known.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"


def default_out_dir(gpu_name: str | None, today: datetime.date | None = None) -> Path:
    today = today or datetime.date.today()
    return Path("benchmarks/results") / f"{today.isoformat()}-sweep-{gpu_slug(gpu_name)}"


def amdahl_targets(plan: Sequence[Planned]) -> list[Planned]:
    """The first FP8 + compile configuration of each preset/batch/attention/AC group: its FP8 settings (recipe,
    lm_head, shape filter) decide which GEMMs count as converted in the analysis. One process only: the analysis
    profiles one GPU's step."""
    chosen: dict[tuple, Planned] = {}
    for planned in plan:
        p = planned.point
        if p.is_fp8 and p.compile != "eager" and p.world_size == 1:
            chosen.setdefault((p.preset, p.batch_size, p.attention, p.ac), planned)
    return list(chosen.values())
