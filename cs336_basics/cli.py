"""The command line every script shares: one flat flag per config field, read from the fields' declarations.

`--help` shows the value a run on this machine would use (the auto preset's, where it sets one), and flags are
never abbreviated (`--max_step` is an error, not `--max_steps`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cs336_basics.config import PRESETS, SECTIONS, RunConfig, check_layer
from cs336_basics.config_layers import build_config, lookup, merge_layers
from cs336_basics.errors import ConfigError
from cs336_basics.parallel.world import torchrun_world
from cs336_basics.training.checkpoint import checkpoint_file, read_checkpoint

# The FP8 paths whose own settings --help groups apart (config.setting's only_on).
PATH_GROUPS = {
    "fused": "this package's fused FP8 path only (--fp8_path fused; --fp8_path auto picks it for them)",
    "torchao": "TorchAO's FP8 path only (--fp8_path torchao; --fp8_path auto picks it for them)",
}


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of steps or runs), refused otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is refused (json keeps the last one without a word)."""
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ConfigError(f"gives {', '.join(map(repr, twice))} twice in one object; keep one")
    return dict(pairs)


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:  # utf-8-sig: a byte-order mark, as some editors write, is not part of the JSON
        values = json.loads(path.read_text(encoding="utf-8-sig"), object_pairs_hook=_unique_keys)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"config file {path} {exc}.") from exc
    except RecursionError as exc:  # json's parser recurses once per level
        raise ConfigError(f"config file {path} is nested too deeply to read; a config has two levels.") from exc
    return check_layer(values, f"the config file {path}", each_setting=True)


class _GivenOnce(argparse.Action):
    """Stores the flag's value; the flag given again is an error (argparse would keep the last one without a word)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given twice; give one (to combine files, merge them into one)")
        setattr(namespace, self.dest, values)


def machine_device_type() -> str:
    """ "cuda" where torch sees a GPU, else "cpu": what --device auto and --preset auto choose here."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_settings(folder: Path) -> dict[str, Any]:
    """The settings of the run in `folder`, as a config layer: its config.json, or where that is missing, those its
    checkpoint records (as the run resolved them); {} where neither can be read (the resume's own checks of the
    folder and its checkpoint then say what is wrong, on every rank alike)."""
    saved = folder / "config.json"
    if saved.is_file():
        return load_config_file(saved)
    checkpoint = checkpoint_file(folder)
    try:
        settings = read_checkpoint(checkpoint, mmap=True)["config"]
    except ConfigError:  # no checkpoint, or one that cannot be read
        return {}
    # How that run was started (perhaps replacing an earlier one) is none of the resume's settings.
    settings = {**settings, "train": {**settings["train"], "overwrite": False}}
    return check_layer(settings, f"the settings in {checkpoint}", each_setting=True)


def _default_text(value: Any, preset_value: Any, preset: str) -> str:
    if preset_value == value and type(preset_value) is type(value):
        return f"(default {value})"
    return f"(default here {preset_value}, from the {preset} preset)"


def add_config_arguments(parser: argparse.ArgumentParser, defaults: RunConfig | None = None) -> None:
    """Add --<field> for every config field, plus --no_<field> for booleans. Parsed values stay None unless the
    user typed the flag, so only typed flags override the file and the preset. `defaults`: the config a run
    would use without flags (for the help text); default: this machine's auto preset."""
    if defaults is None:
        defaults = build_config(device_type=machine_device_type())
    parser.add_argument(
        "--config", action=_GivenOnce, help="JSON config file (same layout as config.json in a run folder)"
    )
    parser.add_argument(
        "--preset", choices=["auto", *PRESETS], help=f"named model/batch shape (default auto: here {defaults.preset})"
    )
    parser.add_argument(
        "--use_flash_attn", action="store_const", const="flash", dest="attention", help="same as --attention flash"
    )
    for section, cls in SECTIONS.items():
        used = getattr(defaults, section)
        for path in (None, *PATH_GROUPS):  # settings only one FP8 path has, under that path
            fields = [f for f in dataclasses.fields(cls) if f.metadata.get("only_on") == path]
            if fields:
                title = f"{section} settings" + (f": {PATH_GROUPS[path]}" if path else "")
                add_field_arguments(
                    parser.add_argument_group(title),
                    cls,
                    dest_prefix=f"{section}.",
                    default_text=lambda f, used=used: _default_text(f.default, getattr(used, f.name), defaults.preset),
                    fields=fields,
                )


def scalar_type(kind: Any) -> type:
    """A setting's value type without its None (`int | None` -> int)."""
    return next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))


def add_field_arguments(
    group: argparse._ActionsContainer,
    cls: type,
    dest_prefix: str = "",
    default_text: Callable[[dataclasses.Field], str] = lambda f: f"(default {f.default})",
    fields: list[dataclasses.Field] | None = None,
) -> None:
    """--<field> for every field (or those in `fields`) of a settings dataclass declared with config.setting (its
    help and choices), plus --no_<field> for booleans; values stay None unless typed. The dataclass checks the
    values when it is built."""
    hints = typing.get_type_hints(cls)
    for f in fields if fields is not None else dataclasses.fields(cls):
        dest = f"{dest_prefix}{f.name}"
        scalar = scalar_type(hints[f.name])
        help_text = f"{f.metadata.get('help', '')} {default_text(f)}".strip()
        if scalar is bool:
            group.add_argument(f"--{f.name}", action="store_true", default=None, dest=dest, help=help_text)
            group.add_argument(f"--no_{f.name}", action="store_false", default=None, dest=dest)
        else:
            group.add_argument(
                f"--{f.name}",
                type=scalar,
                default=None,
                dest=dest,
                metavar=f.name.upper(),
                choices=f.metadata.get("choices"),
                help=help_text,
            )


def config_parser(description: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    """A script's parser with every config flag (train_h100.py's), so all scripts take the same settings."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_config_arguments(parser)
    return parser


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for key, value in vars(args).items():
        if value is None:
            continue
        if key == "attention":  # set by --use_flash_attn
            overrides.setdefault("model", {})["attention"] = value
        elif key == "preset":
            overrides["preset"] = value
        elif "." in key:
            section, name = key.split(".", 1)
            overrides.setdefault(section, {})[name] = value
    return overrides


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """CLI > --config file > preset > defaults. With --resume the run's own settings are the layer under the file
    (its folder's config.json), so `--resume --out_dir RUN` continues the same run, changed only where asked."""
    overrides = overrides_from_args(args)
    from_file = load_config_file(args.config) if args.config else {}
    if lookup("train", "resume", overrides, from_file) is True:
        asked = overrides.get("train", {}).get("parallel", "auto")
        if asked != "auto" and torchrun_world() is None:  # only a run's saved mode waits in one process for torchrun
            raise ConfigError(
                f"--parallel {asked} needs several processes started by torchrun, and this process was not; a resume "
                "in one process runs as one process, keeping the run's own --parallel for torchrun: drop --parallel."
            )
        from_file = merge_layers(run_settings(Path(lookup("train", "out_dir", overrides, from_file))), from_file)
    device = lookup("train", "device", overrides, from_file)
    device_type = "cuda" if str(device).startswith("cuda") else "cpu" if device == "cpu" else machine_device_type()
    return build_config(overrides, from_file, device_type)
