"""The FP8 doctor and the Hugging Face side of it: a transformers causal LM built from a config behind our forward and
through our build stage (--hf_model), the findings that need no GPU (which linears each policy converts, the FLOP
share they put in FP8, each failure mode the issue lists caught with its number), the findings the measured runs
give, and verify_fp8_compilation.py --hf_model end to end on the CPU. Skipped without transformers (the hf extra)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

transformers = pytest.importorskip("transformers")

import json  # noqa: E402

import train_h100  # noqa: E402
import verify_fp8_compilation  # noqa: E402
from cs336_basics.build import build, plan  # noqa: E402
from cs336_basics.config import FP8Config  # noqa: E402
from cs336_basics.config_layers import build_config  # noqa: E402
from cs336_basics.diagnostics import doctor as diagnosis  # noqa: E402
from cs336_basics.diagnostics.amdahl.law import linear_gemm_shapes  # noqa: E402
from cs336_basics.diagnostics.amdahl.report import AmdahlRow  # noqa: E402
from cs336_basics.diagnostics.doctor import (  # noqa: E402
    diagnose,
    diagnose_config,
    measured_findings,
    policy_report,
    policy_share,
)
from cs336_basics.errors import ConfigError  # noqa: E402
from cs336_basics.hf.models import NAMED_SHAPES, CausalLM, build_causal_lm, hf_config  # noqa: E402
from cs336_basics.precision.fp8 import convert_model_to_fp8  # noqa: E402
from cs336_basics.programs import generate  # noqa: E402
from cs336_basics.training.trainer import TrainResult  # noqa: E402


def tiny(**overrides):
    return build_causal_lm(hf_config("llama-tiny", **overrides))


def causes(found) -> list[str]:
    return [f.cause for f in found.findings]


def test_configs_come_from_a_named_shape_or_a_local_directory(tmp_path):
    assert hf_config("llama-1b").hidden_size == NAMED_SHAPES["llama-1b"]["hidden_size"]
    assert hf_config("llama-tiny", num_hidden_layers=3).num_hidden_layers == 3
    hf_config("llama-tiny").save_pretrained(tmp_path)
    assert hf_config(str(tmp_path)).vocab_size == NAMED_SHAPES["llama-tiny"]["vocab_size"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        hf_config(str(tmp_path / "empty"))


# Small configs of each kind, saved as a --hf_model directory is: causal decoders, and what transformers builds as an
# AutoModelForCausalLM that is not one (an encoder's LM head attends both ways) or builds none of.
SMALL = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=64)  # fmt: skip
CAUSAL = {
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64),
    "bert-as-decoder": lambda: transformers.BertConfig(**SMALL, is_decoder=True),  # BERT's own causal mode
}
NOT_CAUSAL = {
    "bert": (lambda: transformers.BertConfig(**SMALL), r"model type 'bert' is an encoder.*attends to later tokens"),
    "roberta": (lambda: transformers.RobertaConfig(**SMALL), r"model type 'roberta' .*attends to later tokens"),
    "bert-generation": (lambda: transformers.BertGenerationConfig(**SMALL),
                        r"model type 'bert-generation' .*attends to later tokens"),
    "llama-bidirectional": (lambda: transformers.LlamaConfig(**SMALL, is_causal=False),
                            r"model type 'llama' with is_causal false .*attends to later tokens"),
    "vit": (lambda: transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
            r"model type 'vit' has no causal language model"),
    "bloom": (lambda: transformers.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4),
              r"model type 'bloom': .*without SDPA attention"),  # causal, but build_causal_lm could not build it
}  # fmt: skip


def saved(tmp_path, name: str, config) -> str:
    config.save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def sees_later_tokens(model: nn.Module) -> bool:
    """Whether changing the token at position 10 changes the logits at positions 0..9 (a causal LM's never do)."""
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, 10] += 1
    with torch.no_grad():
        return not torch.equal(model(ids)[0, :10], model(changed)[0, :10])


@pytest.mark.parametrize("name", CAUSAL)
def test_a_causal_decoder_config_is_accepted_and_its_model_never_sees_later_tokens(tmp_path, name):
    spec = saved(tmp_path, name, CAUSAL[name]())
    assert hf_run(spec, model={"context_length": 16}).model.hf_model == spec
    assert not sees_later_tokens(build_causal_lm(hf_config(spec), dtype=torch.float32).eval())


@pytest.mark.parametrize("name", NOT_CAUSAL)
def test_a_config_that_is_no_causal_decoder_is_refused_with_its_model_type(tmp_path, name):
    make, refusal = NOT_CAUSAL[name]
    spec = saved(tmp_path, name, make())
    with pytest.raises(ConfigError, match=refusal):
        hf_run(spec, model={"context_length": 16})
    if "later tokens" in refusal:  # and rightly: what transformers builds for it does
        model = transformers.AutoModelForCausalLM.from_config(make(), attn_implementation="sdpa").eval()
        assert sees_later_tokens(CausalLM(model))


def test_an_unknown_model_type_is_refused_with_its_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nosuchmodel", "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"--hf_model .*model type .nosuchmodel."):
        hf_run(str(tmp_path))


def test_train_h100_refuses_a_bert_config_in_one_line_before_any_work(tmp_path, token_files, capsys):
    spec = saved(tmp_path, "bert", NOT_CAUSAL["bert"][0]())
    argv = ["--hf_model", spec, "--context_length", "16", "--batch_size", "2", "--max_steps", "1", "--device", "cpu",
            *token_files, "--out_dir", str(tmp_path / "run")]  # fmt: skip
    code = train_h100.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: --hf_model ") and err.count("\n") == 1, err
    assert "model type 'bert'" in err and "FINAL CONFIGURATION SUMMARY" not in out and not (tmp_path / "run").exists()


def test_the_wrapped_model_is_called_like_ours():
    model = tiny()
    ids = torch.randint(0, model.vocab_size, (2, 16))
    targets = torch.roll(ids, -1, dims=1)
    logits = model(ids)
    assert logits.shape == (2, 16, model.vocab_size)
    torch.testing.assert_close(
        model(ids, targets=targets), F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    )
    embeddings = model.hf.get_input_embeddings().weight.numel()
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - embeddings


def test_the_accelerate_policy_is_accelerates_own_filter():
    ao = pytest.importorskip("accelerate.utils.ao")
    model = tiny()
    first, last = ao.find_first_last_linear_layers(model)
    theirs = [fqn for fqn, m in model.named_modules() if isinstance(m, nn.Linear)
              and ao.filter_linear_layers(m, fqn, layers_to_filter=[first, last])]  # fmt: skip
    report = policy_report(model, "accelerate")
    assert report.converted == theirs and set(report.skipped) == {first, last}
    assert first == "hf.model.layers.0.self_attn.q_proj" and last == "hf.lm_head"


def test_the_every_linear_policy_is_what_torchaos_conversion_converts():
    model = tiny()
    report = policy_report(model, "every-linear")
    converted = convert_model_to_fp8(model, FP8Config(use_fp8=True, fp8_emulate=True, fp8_lm_head=True))
    assert report.converted == converted.converted and len(report.converted) == 15


def test_flop_share_and_its_bound_follow_amdahls_law():
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False))
    every = policy_share(model, "every-linear", tokens=32, other_flops=0.0)
    assert every.fp8_flop_share == 1.0 and every.flop_bound_speedup == pytest.approx(2.0)
    first_and_last = policy_share(model, "accelerate", tokens=32, other_flops=0.0)
    assert first_and_last.report.n_converted == 0 and first_and_last.fp8_flop_share == 0.0
    linear_flops = 3 * 2 * 32 * 64 * (64 + 32)  # three GEMMs per linear, 2 FLOPs per multiply-add
    half = policy_share(model, "every-linear", tokens=32, other_flops=linear_flops)
    assert half.fp8_flop_share == pytest.approx(0.5) and half.flop_bound_speedup == pytest.approx(1 / 0.75)


def hf_run(spec: str, **sections) -> object:
    """A RunConfig for the Hugging Face model `spec` on the CPU, `sections` as build_config overrides."""
    model = {"hf_model": spec, **sections.pop("model", {})}
    return build_config({"model": model, "train": {"device": "cpu", **sections.pop("train", {})}, **sections})


def test_each_failure_mode_is_found_with_its_number(monkeypatch, tmp_path):
    hf_config("llama-tiny", vocab_size=500).save_pretrained(tmp_path)  # a vocabulary FP8 GEMMs cannot take
    config = hf_run(str(tmp_path), model={"context_length": 7}, train={"batch_size": 3})
    found = diagnose_config(config, compile_model=False)
    assert {"FP8 without torch.compile", "shape-rule: no layer converted", "dimensions FP8 GEMMs cannot take",
            "tokens per micro-batch not a multiple of 16", "layers too small for tensorwise FP8",
            "Accelerate's default filter"} <= set(causes(found))  # fmt: skip
    by_cause = {f.cause: f for f in found.findings}
    assert (
        "1 linears have a dim not divisible by 16 (e.g. hf.lm_head)"
        in by_cause["dimensions FP8 GEMMs cannot take"].measured
    )
    assert by_cause["tokens per micro-batch not a multiple of 16"].measured == "21 tokens"
    assert not by_cause["Accelerate's default filter"].problem
    monkeypatch.setattr(diagnosis, "torchao_version", lambda: (None, "ImportError: No module named 'torchao'"))
    missing = diagnose_config(hf_run("llama-tiny", model={"context_length": 16}, train={"batch_size": 2}))
    assert causes(missing)[0] == "FP8 backend missing" and "No module named" in missing.findings[0].measured
    assert "FP8 without torch.compile" not in causes(missing)


def test_a_model_too_small_for_fp8_is_told_so():
    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False))
    found = diagnose(model, tokens=64, n_layers=1, dim=64, seq_len=64_000)  # attention dwarfs the linears
    low = next(f for f in found.findings if f.cause == "too little of the step in FP8 GEMMs")
    assert "train it in BF16" in low.advice
    assert found.to_dict()["policies"][2]["fp8_flop_share"] < diagnosis.LOW_SHARE


def result(tokens_per_sec: float, peak_mem_gib: float) -> TrainResult:
    return TrainResult(steps=10, tokens=1, loss=1.0, val_loss=None, tokens_per_sec=tokens_per_sec, mfu=None,
                       peak_mem_gib=peak_mem_gib, compile_s=None, metrics_path="", plot_path="",
                       checkpoint_path=None)  # fmt: skip


def amdahl(x: float, s: float, measured: float) -> AmdahlRow:
    predicted = diagnosis.amdahl_prediction(x, s)
    return AmdahlRow(preset="p", batch_size=1, linear_share=x, matmul_speedup=s, predicted_speedup=predicted,
                     measured_speedup=measured, predicted_fp8_step_ms=100 / predicted,
                     measured_fp8_step_ms=100 / measured, cast_overhead_ms=100 / measured - 100 / predicted,
                     n_converted=1)  # fmt: skip


def test_the_seed_failure_is_named_cause_by_cause_with_its_numbers():
    """FP8 18% slower than BF16 with 43% more memory, eager, from a small model: each cause with its number."""
    found = measured_findings(result(82.0, 14.3), result(100.0, 10.0), amdahl(0.15, 1.5, 0.82), compiled=False)
    by_cause = {f.cause: f for f in found}
    assert by_cause["FP8 slower than BF16"].measured.startswith("0.820x (82 vs 100 tokens/s, eager")
    overhead = by_cause["FP8 costs more than its GEMMs save"]
    assert "predicted 1.053x from X = 15%" in overhead.measured and "s = 1.50x, measured 0.820x" in overhead.measured
    assert "Compile the model" in overhead.advice and "--fp8_shape_filter keeps" in overhead.advice
    filtered = measured_findings(result(95.0, 9.0), result(100.0, 10.0), amdahl(0.5, 1.6, 0.95), True, True)
    advice = next(f.advice for f in filtered if f.cause == "FP8 costs more than its GEMMs save")
    assert advice == "More tokens per micro-batch amortise each cast over a larger GEMM."  # the filter is on already
    assert "X = 15% of the BF16 step" in by_cause["little of the step in converted GEMMs"].measured
    memory = by_cause["FP8 uses more memory than BF16"]
    assert "14.30 vs 10.00 GiB (1.43x, eager" in memory.measured and "compile the model" in memory.advice
    # A run that pays as its GEMMs promise, in no more memory, gets no finding.
    assert measured_findings(result(120.0, 9.0), result(100.0, 10.0), amdahl(0.5, 1.6, 1.22), compiled=True) == []


def test_a_hugging_face_config_fixes_the_runs_model_shape(tmp_path):
    config = hf_run("llama-1b", model={"context_length": 2048}, train={"batch_size": 4})
    m = config.model
    assert (m.dim, m.n_layers, m.n_heads, m.kv_heads, m.intermediate_size, m.vocab_size) == (
        2048,
        22,
        32,
        4,
        5632,
        32000,
    )
    with pytest.raises(ConfigError, match="--dim 512 .the config has 2048. disagrees"):
        hf_run("llama-1b", model={"dim": 512})
    with pytest.raises(ConfigError, match="longer than the config's max_position_embeddings .256."):
        hf_run("llama-tiny", model={"context_length": 512})
    # The GEMM shapes of a step come from the model itself, built on the meta device (no memory).
    shapes = linear_gemm_shapes(m, 4)
    assert sum(s.count for s in shapes if s.kind == "forward") == 22 * 7 + 1
    assert shapes[0].m == 4 * 2048 and shapes[0].layers[0] == "hf.model.layers.0.self_attn.q_proj"


def test_the_build_stage_builds_a_hugging_face_model_and_refuses_what_it_cannot_run():
    config = hf_run("llama-tiny", model={"context_length": 16}, train={"batch_size": 4},
                    fp8={"use_fp8": True, "fp8_emulate": True})  # fmt: skip
    built = build(config)
    assert isinstance(built.model, CausalLM) and built.config.fp8.fp8_path == "torchao"
    assert built.fp8_linears == built.conversion.n_converted == 14  # the lm_head stays BF16: TorchAO's default
    assert any("fused path converts this package's model only" in note for note in built.auto_choices)
    refusals = {
        "use --attention sdpa": {"model": {"attention": "math"}},
        "--gradient_checkpointing recomputes": {"model": {"gradient_checkpointing": True}},
        "fused FP8 path converts this package's model only": {"fp8": {"use_fp8": True, "fp8_path": "fused"}},
        r"fused FP8 path \(--fp8_scaling delayed named it\)": {"fp8": {"use_fp8": True, "fp8_scaling": "delayed"}},
    }
    for message, overrides in refusals.items():
        with pytest.raises(ConfigError, match=message):
            plan(hf_run("llama-tiny", model={"context_length": 16, **overrides.pop("model", {})}, **overrides))


def test_the_wrapped_model_samples_text_like_ours():
    ids = tiny().generate(torch.tensor([1, 2, 3]), 5, temperature=0)
    assert ids.shape == (5,) and ids.dtype == torch.long


def test_the_doctor_runs_on_a_hugging_face_model_on_the_cpu(tmp_path, token_files, capsys):
    out = tmp_path / "doctor.json"
    argv = ["--hf_model", "llama-tiny", "--context_length", "16", "--batch_size", "4", "--steps", "4",
            "--device", "cpu", *token_files, "--json", str(out)]  # fmt: skip
    code = verify_fp8_compilation.main(argv)
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    payload = json.loads(out.read_text())
    assert [c["status"] for c in payload["checks"]] == ["PASS", "PASS", "PASS", "PASS", "SKIP"]
    assert [p["policy"] for p in payload["diagnosis"]["policies"]] == ["accelerate", "shape-rule", "every-linear"]
    assert payload["amdahl"] is None  # needs a GPU
    assert "FP8 conversion policies (64 tokens per micro-batch)" in stdout
    assert payload["runs"][1]["dim"] == 64 and payload["runs"][1]["n_layers"] == 2
    assert payload["runs"][1]["hf_model"] == "llama-tiny"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "path_flags, converted",
    [(["--no_fp8_shape_filter"], 14), (["--fp8_path", "accelerate"], 13)],  # TorchAO's path; Accelerate's
    ids=["torchao", "accelerate"],
)
def test_on_a_gpu_the_doctor_sets_the_amdahl_prediction_beside_the_measured_ratio(
    path_flags, converted, tmp_path, token_files, capsys
):
    out = tmp_path / "doctor.json"
    argv = ["--hf_model", "llama-tiny", "--context_length", "64", "--batch_size", "4", "--steps", "6",
            "--min_speedup", "0", *path_flags, *token_files, "--json", str(out)]  # fmt: skip
    code = verify_fp8_compilation.main(argv)
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    payload = json.loads(out.read_text())
    checks = {c["name"]: c for c in payload["checks"]}
    assert checks["fp8_gemms_launched"]["evidence"]["scaled_mm"] >= 3 * converted
    row = payload["amdahl"]
    assert row["n_converted"] == converted and 0 < row["linear_share"] < 1 and row["matmul_speedup"] > 0
    assert row["measured_speedup"] == pytest.approx(row["bf16_step_ms"] / row["measured_fp8_step_ms"])
    assert "why: X = " in stdout


def test_train_h100_trains_and_resumes_a_hugging_face_model_whose_run_generate_reads(tmp_path, capsys):
    text = tmp_path / "train.txt"
    text.write_text("def add(a, b):\n    return a + b\n\n" * 2000)
    out = tmp_path / "run"
    argv = ["--hf_model", "llama-tiny", "--context_length", "16", "--batch_size", "4", "--max_steps", "2",
            "--device", "cpu", "--train_data", str(text), "--out_dir", str(out)]  # fmt: skip
    assert train_h100.main(argv) == 0
    assert "Hugging Face llama-tiny (transformers, random weights): dim 64" in capsys.readouterr().out
    assert train_h100.main([*argv, "--resume", "--max_steps", "3"]) == 0  # the run folder resumes
    assert json.loads((out / "result.json").read_text())["steps"] == 3
    model, tokenizer = generate.load_trained(out, torch.device("cpu"))
    assert isinstance(model, CausalLM)
    assert generate.sample_text(model, tokenizer, generate.Sampling(prompt="def ", max_new_tokens=4)).startswith("def ")
