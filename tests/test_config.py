import argparse
import dataclasses
import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import train_h100
from cs336_basics import build as build_module
from cs336_basics.build import build, check_cuda_graphs_request, plan
from cs336_basics.cli import add_config_arguments, config_from_args, config_parser
from cs336_basics.compiled import auto_compile_mode, compile_options, hides_ops_from_profiler, resolve_compile_wrapper
from cs336_basics.config import PRESETS, ModelConfig, RunConfig
from cs336_basics.config_layers import build_config
from cs336_basics.errors import ConfigError
from cs336_basics.parallel.world import SINGLE, World


def parse(*argv: str) -> argparse.Namespace:
    return config_parser(None).parse_args(list(argv))


def test_precedence_cli_over_file_over_preset_over_default(tmp_path):
    config_file = tmp_path / "cfg.json"
    config_file.write_text(json.dumps({"preset": "cpu-small", "model": {"dim": 64}, "optim": {"lr": 0.5}}))
    cfg = config_from_args(parse("--config", str(config_file), "--lr", "0.25", "--device", "cpu"))
    assert cfg.optim.lr == 0.25  # CLI beats file
    assert cfg.model.dim == 64  # file beats preset
    assert cfg.model.n_layers == PRESETS["cpu-small"]["model"]["n_layers"]  # preset beats default
    assert cfg.optim.weight_decay == RunConfig().optim.weight_decay  # default


def test_boolean_flags_and_flash_alias():
    cfg = config_from_args(parse("--device", "cpu", "--no_compile_model", "--gradient_checkpointing"))
    assert cfg.train.compile_model is False and cfg.model.gradient_checkpointing is True
    assert config_from_args(parse("--device", "cpu", "--use_flash_attn")).model.attention == "flash"
    cfg = config_from_args(parse("--device", "cpu", "--gradient_checkpointing", "--no_gradient_checkpointing"))
    assert cfg.model.gradient_checkpointing is False


def test_auto_preset_and_plan_on_cpu():
    p = plan(config_from_args(parse("--device", "cpu")))
    assert p.config.preset == "cpu-small" and p.device.type == "cpu"
    assert p.config.train.dtype == "float32" and p.config.train.compile_model is False
    assert p.config.fp8.use_fp8 is False  # decided in the plan: no FP8 without a GPU
    assert "dtype=float32" in p.auto_choices and "compile_model=False" in p.auto_choices
    # The schedule length is fixed when a run starts (and saved with it): extending max_steps later keeps it.
    assert p.config.optim.lr_decay_steps == p.config.train.max_steps
    assert build_config(device_type="cuda").preset == "366m"


def test_plan_resolves_the_compile_scope_and_says_so():
    compiled = plan(config_from_args(parse("--device", "cpu", "--compile_model")))
    assert compiled.config.train.compile_scope == "blocks"
    assert any(note.startswith("compile_scope=blocks (") for note in compiled.auto_choices)
    asked = plan(config_from_args(parse("--device", "cpu", "--compile_model", "--compile_scope", "model")))
    assert asked.config.train.compile_scope == "model" and not any("compile_scope" in n for n in asked.auto_choices)


def test_config_round_trips_through_dict():
    cfg = build_config({"model": {"n_kv_heads": 2}})
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(dim=100, n_heads=3), "divisible by n_heads"),
        (dict(dim=96, n_heads=6, n_kv_heads=4), "divisible by n_kv_heads"),
        (dict(dim=36, n_heads=4), "odd"),
        (dict(attention="fast"), "attention must be one of"),
    ],
)
def test_bad_model_shapes_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**fields)


def test_unknown_settings_in_file_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown model settings"):
        build_config(from_file={"model": {"d_model": 4}})
    with pytest.raises(ConfigError, match="unknown preset"):
        build_config({"preset": "huge"})


@pytest.mark.parametrize(
    "file_values, message",
    [
        ({"train": {"max_steps": "ten"}}, r"max_steps must be an integer, got 'ten'"),
        ({"model": {"dim": "64"}}, r"dim must be an integer, got '64'"),
        ({"train": {"resume": "no"}}, r"resume must be true or false, got 'no'"),
        ({"train": {"max_steps": 2.5}}, r"max_steps must be an integer"),
        ({"train": {"batch_size": True}}, r"batch_size must be an integer, got True"),
        ({"optim": {"lr": None}}, r"lr must be a number, got null"),
        ({"optim": {"lr": "fast"}}, r"lr must be a number"),
        ({"model": "big"}, r"section 'model' must be an object"),
    ],
)
def test_config_file_types_are_checked(file_values, message):
    with pytest.raises(ConfigError, match=message):
        build_config(from_file=file_values)


@pytest.mark.parametrize(
    "text, section",
    [('{"train": [1, 2]}', "train"), ('{"model": null}', "model"), ('{"optim": "fast"}', "optim"),
     ('{"preset": ["cpu-small"]}', "preset")],
)  # fmt: skip
def test_a_config_file_section_that_is_not_an_object_names_the_section_and_the_file(tmp_path, text, section):
    """A section given as anything but an object would replace the preset's settings for it with the flags' alone."""
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(f"the config file {path}: section {section!r} must be")):
        config_from_args(parse("--config", str(path), "--max_steps", "3", "--device", "cpu"))
    with pytest.raises(ConfigError, match=rf"{section!r}"):  # the same check for a file layer given in code
        build_config({"train": {"max_steps": 3}}, from_file=json.loads(text))


@pytest.mark.parametrize(
    "values, message",
    [({"train": {"max_steps": "ten"}}, "train.max_steps must be an integer, got 'ten'"),
     ({"train": {"max_steps": 0}}, "train.max_steps must be >= 1; got 0"),
     ({"fp8": {"fp8_recipe": "blockwise"}}, "fp8.fp8_recipe must be one of"),
     ({"optim": {"lr_typo": 1}}, "unknown optim settings ['lr_typo']")],
)  # fmt: skip
def test_a_bad_setting_in_a_config_file_names_the_file_and_the_setting(tmp_path, values, message):
    """A flag's error names the flag; a file's names the file and the setting, not a bare field name."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=re.escape(f"the config file {path}: {message}")):
        config_from_args(parse("--config", str(path), "--device", "cpu"))


def test_a_config_file_nested_too_deep_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text('{"model": ' * 100_000 + "{}" + "}" * 100_000)
    code = train_h100.main(["--config", str(path), "--out_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and str(path) in err, err
    assert "nested too deeply" in err and not (tmp_path / "run").exists()


def test_an_integer_is_accepted_where_a_number_is_expected():
    assert build_config(from_file={"optim": {"lr": 1, "min_lr": 0}}).optim.lr == 1.0


@pytest.mark.parametrize(
    "section, values, message",
    [
        ("optim", {"lr": -0.01}, r"lr must be > 0"),
        ("optim", {"lr": 0.0}, r"lr must be > 0"),
        ("optim", {"lr": 1e39}, r"lr must be > 0 and at most 3.4e\+38"),
        ("optim", {"lr": float("nan")}, r"lr must be a number, got nan"),
        ("optim", {"beta1": 1.5}, r"beta1 must be in \[0, 1\)"),
        ("optim", {"warmup_steps": -5}, r"warmup_steps must be >= 0"),
        ("optim", {"min_lr": 0.1, "lr": 0.01}, r"min_lr \(0.1\) must not exceed lr"),
        ("optim", {"max_grad_norm": 0.0}, r"max_grad_norm must be > 0"),
        ("train", {"batch_size": 0}, r"batch_size must be >= 1"),
        ("train", {"batch_size": -2}, r"batch_size must be >= 1"),
        ("train", {"gradient_accumulation_steps": 0}, r"gradient_accumulation_steps must be >= 1"),
        ("train", {"log_every": 0}, r"log_every must be >= 1"),
        ("train", {"eval_batches": 0}, r"eval_batches must be >= 1"),
        ("train", {"eval_every": -3}, r"eval_every must be >= 0"),
        ("train", {"checkpoint_every": -1}, r"checkpoint_every must be >= 0"),
        ("train", {"compile_mode": "turbo"}, r"compile_mode must be one of auto, default, reduce-overhead"),
        ("train", {"resume": True, "overwrite": True}, r"pass one of them"),
        ("train", {"out_dir": " "}, r"out_dir must not be empty"),
        ("model", {"norm_eps": 0.0}, r"norm_eps must be > 0"),
        ("data", {"dataset": "wiki"}, r"dataset must be one of stdlib, tinystories"),
    ],
)
def test_ranges_are_checked_whatever_the_source(section, values, message):
    with pytest.raises(ConfigError, match=message):
        build_config({section: values})
    with pytest.raises(ConfigError, match=message):
        build_config(from_file={section: values})


def test_max_grad_norm_inf_turns_clipping_off():
    assert build_config({"optim": {"max_grad_norm": float("inf")}}).optim.max_grad_norm == float("inf")


def test_flags_are_never_abbreviated(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse("--max_step", "3")
    assert exit_info.value.code == 2 and "unrecognized arguments: --max_step" in capsys.readouterr().err


def test_choices_are_checked_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--compile_mode", "turbo")
    assert "invalid choice: 'turbo'" in capsys.readouterr().err


def test_help_shows_the_values_a_run_here_uses(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no line wrapping inside the phrases checked
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, defaults=build_config(device_type="cpu"))
    text = " ".join(parser.format_help().split())
    assert "model width d_model (default here 128, from the cpu-small preset)" in text
    assert "peak learning rate (default here 0.002, from the cpu-small preset)" in text
    assert "AdamW beta1 (default 0.9)" in text  # not set by the preset
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, defaults=build_config(device_type="cuda"))
    text = " ".join(parser.format_help().split())
    assert "model width d_model (default 896)" in text  # the 366m preset keeps the field default
    assert "(the fused path's: delayed) (default auto)" in text
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, defaults=build_config({"preset": "1.3b"}, device_type="cuda"))
    text = " ".join(parser.format_help().split())
    assert "(default here 400, from the 1.3b preset)" in text


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graphs_with_gradient_accumulation_are_refused_under_fsdp_only(mode):
    # One process and DDP sum the micro-batches' gradients outside the graphs (training/accumulation.py); FSDP2
    # reduce-scatters them inside backward.
    train = RunConfig().train
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    accumulating = dataclasses.replace(train, compile_model=True, compile_mode=mode, gradient_accumulation_steps=4)
    with pytest.raises(ConfigError, match=r"CUDA graphs.*--gradient_accumulation_steps 4 under FSDP2.*--parallel ddp"):
        check_cuda_graphs_request(accumulating, cuda, "fsdp")
    for parallel_mode in ("none", "ddp"):
        check_cuda_graphs_request(accumulating, cuda, parallel_mode)
    # Allowed under FSDP2: no accumulation, a mode without CUDA graphs, no compile, or the CPU.
    for allowed in (
        dataclasses.replace(accumulating, gradient_accumulation_steps=1),
        dataclasses.replace(accumulating, compile_mode="max-autotune-no-cudagraphs"),
        dataclasses.replace(accumulating, compile_model=False),
    ):
        check_cuda_graphs_request(allowed, cuda, "fsdp")
    check_cuda_graphs_request(accumulating, cpu, "fsdp")


def test_auto_compile_mode_uses_cuda_graphs_for_an_fp8_step_in_one_process_and_under_ddp_and_fsdp2():
    train = dataclasses.replace(RunConfig().train, compile_model=True)
    accumulating = dataclasses.replace(train, gradient_accumulation_steps=2)
    cuda = torch.device("cuda")
    assert auto_compile_mode(train, True, cuda, "none")[0] == "reduce-overhead"
    mode, why = auto_compile_mode(accumulating, True, cuda, "none")
    assert mode == "reduce-overhead" and "summed outside the graphs" in why
    mode, why = auto_compile_mode(train, True, cuda, "ddp")
    assert mode == "reduce-overhead" and "DDP" in why
    mode, why = auto_compile_mode(accumulating, True, cuda, "ddp")
    assert mode == "reduce-overhead" and "averaged over the ranks after the last" in why
    mode, why = auto_compile_mode(train, True, cuda, "fsdp")
    assert mode == "reduce-overhead" and "FSDP2" in why and "--compile_mode default gives that memory back" in why
    # FSDP2 reduce-scatters each micro-batch's gradients inside backward: its accumulation runs without CUDA graphs,
    # which build.check_cuda_graphs_request would refuse if asked for.
    mode, why = auto_compile_mode(accumulating, True, cuda, "fsdp")
    assert mode == "default" and "accumulation" in why
    check_cuda_graphs_request(dataclasses.replace(accumulating, compile_mode=mode), cuda, "fsdp")
    # A C++ wrapper asked for is honoured: auto leaves CUDA graphs out, which inductor would turn off under it.
    cpp = dataclasses.replace(train, compile_wrapper="cpp")
    for parallel_mode in ("none", "ddp", "fsdp"):
        mode, why = auto_compile_mode(cpp, True, cuda, parallel_mode)
        assert mode == "default" and "--compile_wrapper cpp" in why
        assert resolve_compile_wrapper(dataclasses.replace(cpp, compile_mode=mode), cuda, SINGLE)[0] == "cpp"
    for mode, why in (
        auto_compile_mode(train, False, cuda, "none"),
        auto_compile_mode(train, True, torch.device("cpu"), "none"),
        auto_compile_mode(dataclasses.replace(train, compile_model=False), True, cuda, "none"),
    ):
        assert mode == "default" and why


def test_auto_compile_wrapper_is_cpp_only_for_a_compiled_cuda_step_without_cuda_graphs():
    train = dataclasses.replace(RunConfig().train, compile_model=True, compile_mode="default")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    torchrun = World(rank=0, local_rank=0, world_size=2, launched=True)
    assert resolve_compile_wrapper(train, cuda, SINGLE)[0] == "cpp"
    no_graphs = dataclasses.replace(train, compile_mode="max-autotune-no-cudagraphs")
    assert resolve_compile_wrapper(no_graphs, cuda, SINGLE)[0] == "cpp"
    for graphs_or_cpu_or_eager, device, world in (
        (dataclasses.replace(train, compile_mode="reduce-overhead"), cuda, SINGLE),
        (dataclasses.replace(train, compile_mode="max-autotune"), cuda, SINGLE),
        (train, cpu, SINGLE),
        (dataclasses.replace(train, compile_model=False), cuda, SINGLE),
        (train, cuda, torchrun),  # across processes, no mode named
    ):
        wrapper, why = resolve_compile_wrapper(graphs_or_cpu_or_eager, device, world)
        assert wrapper == "python" and why
    for parallel_mode, fp8_path in (("ddp", "fused"), ("fsdp", None), ("fsdp", "torchao")):
        assert resolve_compile_wrapper(train, cuda, torchrun, parallel_mode, fp8_path)[0] == "python"
    # The fused FP8 step under FSDP2 waits for the host: C++ (INDEX.md: 2026-11-28-fsdp2-cpp-wrapper-x2-h200).
    wrapper, why = resolve_compile_wrapper(train, cuda, torchrun, "fsdp", "fused")
    assert wrapper == "cpp" and "FSDP2" in why
    graphs = dataclasses.replace(train, compile_mode="reduce-overhead")
    assert resolve_compile_wrapper(graphs, cuda, torchrun, "fsdp", "fused")[0] == "python"
    # Asked for: honoured as asked, where something is compiled; refused where nothing is.
    python, cpp = (dataclasses.replace(train, compile_wrapper=wrapper) for wrapper in ("python", "cpp"))
    assert resolve_compile_wrapper(python, cuda, SINGLE) == ("python", "asked for")
    assert (
        resolve_compile_wrapper(cpp, cpu, SINGLE)
        == resolve_compile_wrapper(cpp, cuda, torchrun)
        == ("cpp", "asked for")
    )
    with pytest.raises(ConfigError, match="--compile_wrapper cpp.*compiles nothing"):
        resolve_compile_wrapper(dataclasses.replace(cpp, compile_model=False), cuda, SINGLE)
    # Inductor would silently drop CUDA graphs under the C++ wrapper: refused instead.
    for graphs in ("reduce-overhead", "max-autotune"):
        with pytest.raises(ConfigError, match=f"--compile_wrapper cpp cannot run with --compile_mode {graphs}"):
            resolve_compile_wrapper(dataclasses.replace(cpp, compile_mode=graphs), cuda, SINGLE)


def test_a_profile_of_a_step_under_cuda_graphs_or_the_cpp_wrapper_comes_from_a_twin():
    cuda = torch.device("cuda")
    train = dataclasses.replace(RunConfig().train, compile_model=True, compile_mode="default", compile_wrapper="python")
    assert hides_ops_from_profiler(train, cuda) is None
    assert "CUDA graph" in hides_ops_from_profiler(dataclasses.replace(train, compile_mode="reduce-overhead"), cuda)
    assert "C++ wrapper" in hides_ops_from_profiler(dataclasses.replace(train, compile_wrapper="cpp"), cuda)
    assert hides_ops_from_profiler(dataclasses.replace(train, compile_model=False, compile_wrapper="cpp"), cuda) is None


def test_compile_options_add_the_cpp_wrapper_to_the_modes_own_options():
    assert compile_options("reduce-overhead", "python", "cuda") == {"mode": "reduce-overhead", "fullgraph": True}
    default = compile_options("default", "cpp", "cuda")
    assert default["fullgraph"] and "mode" not in default  # torch.compile takes options or a mode, not both
    # With the settings inductor pairs with the C++ wrapper, which a later-compiled backward would otherwise miss.
    assert default["options"]["cpp_wrapper"] and default["options"]["triton.store_cubin"]
    autotune = compile_options("max-autotune-no-cudagraphs", "cpp", "cuda")["options"]
    assert autotune["cpp_wrapper"] and autotune["max_autotune"] and not autotune["triton.cudagraphs"]
    # A CUDA run's C++ wrapper is built without a vector instruction set (no per-process checks); on the CPU, whose
    # kernels are C++ too, inductor keeps choosing one.
    assert default["options"]["cpp.vec_isa_ok"] is False
    assert "cpp.vec_isa_ok" not in compile_options("default", "cpp", "cpu")["options"]


def test_inductor_skips_its_vector_isa_checks_when_told_no_set_may_be_used():
    """What the CUDA C++ wrapper's `cpp.vec_isa_ok` False relies on: inductor then builds and loads no test library
    (each check a new Python process) and picks no set. In a child process: the picked set is cached per process."""
    code = textwrap.dedent(
        """
        import torch
        from torch._inductor import config, cpu_vec_isa

        def no_check(*args, **kwargs):
            raise AssertionError("a vector ISA check ran")

        cpu_vec_isa.VecISA.check_build = no_check
        with config.patch({"cpp.vec_isa_ok": False}):
            print(bool(cpu_vec_isa.pick_vec_isa()), len(cpu_vec_isa.valid_vec_isa_list()))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "0"]


def test_the_built_config_names_the_compile_mode_auto_chose():
    config = build_config({"preset": "cpu-small", "model": {"dim": 32, "n_layers": 1}}, device_type="cpu")
    assert config.train.compile_mode == "auto"
    built = build(config)
    assert built.config.train.compile_mode == "default"
    assert "compile_mode=default (no compiled CUDA step)" in built.auto_choices
    assert built.config.train.compile_wrapper == "python"
    assert "compile_wrapper=python (no compiled CUDA step)" in built.auto_choices
    explicit = build(config.replace(train={"compile_mode": "max-autotune-no-cudagraphs"}))
    assert explicit.config.train.compile_mode == "max-autotune-no-cudagraphs"
    assert not any(note.startswith("compile_mode=") for note in explicit.auto_choices)


def test_planning_applies_the_cuda_graphs_check(monkeypatch):
    seen = []
    check = lambda train, device, parallel_mode: seen.append((train, device, parallel_mode))  # noqa: E731
    monkeypatch.setattr(build_module, "check_cuda_graphs_request", check)
    planned = plan(build_config({"preset": "cpu-small", "train": {"gradient_accumulation_steps": 2}}))
    assert seen == [(planned.config.train, planned.device, planned.parallel.mode)]
