"""`python -m flashgrad.demo`: a short run trains, passes its gradient check and writes its outputs;
the gradient check itself catches a wrong backward."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from flashgrad.demo import reference_ops  # noqa: E402
from flashgrad.demo.cli import main  # noqa: E402
from flashgrad.demo.gradient_check import check_layer  # noqa: E402
from flashgrad.demo.kernels import Kernels, reference_kernels  # noqa: E402
from flashgrad.demo.model import ModelConfig  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run_quick_demo(out, device: str) -> tuple[subprocess.CompletedProcess, dict]:
    command = [sys.executable, "-m", "flashgrad.demo", "--quick", "--device", device,
               "--out", str(out), "--seed", "3"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"demo failed:\n{run.stdout}\n{run.stderr}"
    return run, json.loads((out / "log.json").read_text())


def _assert_trained_and_checked(run, log, out, tolerance: float) -> None:
    # The run used flashgrad's own kernels, not the plain PyTorch baseline.
    assert log["kernels"] == "flashgrad"
    check = log["gradient_check"]
    assert check["passed"], check
    assert sorted(layer["layer"] for layer in check["layers"]) == [
        "attention", "chunk_gdn", "recurrent_gdn"]
    for layer in check["layers"]:
        assert layer["worst"] <= tolerance, layer
        assert sorted(layer["op_input_errors"]) == (
            ["k", "q", "v"] if layer["layer"] == "attention" else ["beta", "g", "k", "q", "v"])
        assert (layer["lse"] is not None) == (layer["layer"] == "attention")

    losses = [step["loss"] for step in log["steps"]]
    assert len(losses) == log["train"]["steps"] >= 20
    assert all(torch.isfinite(torch.tensor(losses)))
    # A character model starts near ln(vocabulary) and learns the character frequencies within a
    # few dozen steps: the falls asserted are several times the step-to-step noise.
    assert statistics.mean(losses[-5:]) < statistics.mean(losses[:3]) - 0.5, losses
    assert log["held_out_loss_end"] < log["held_out_loss_start"] - 0.5
    assert all(step["tokens_per_s"] > 0 for step in log["steps"])

    assert (out / "loss_curve.png").read_bytes()[:8] == PNG_SIGNATURE
    assert log["sample"].startswith(log["sample_prompt"])
    assert len(log["sample"]) == len(log["sample_prompt"]) + 60
    assert "gradient check passed" in run.stdout
    assert log["sample"] in run.stdout


def test_quick_demo_trains_and_passes_its_gradient_check(tmp_path):
    run, log = _run_quick_demo(tmp_path / "demo", "cpu")
    assert log["compute_dtype"] == "torch.float32"
    _assert_trained_and_checked(run, log, tmp_path / "demo", tolerance=1e-4)


@pytest.mark.gpu
def test_quick_demo_on_the_gpu(tmp_path):
    run, log = _run_quick_demo(tmp_path / "demo", "cuda")
    assert log["compute_dtype"] == "torch.bfloat16"
    _assert_trained_and_checked(run, log, tmp_path / "demo", tolerance=5e-2)


def _cuda_refuses_fp8(flashgrad) -> bool:
    """True when this build's CUDA kernels refuse e4m3 inputs (NotImplementedError)."""
    x = torch.zeros(1, 16, 1, 64, device="cuda", dtype=torch.bfloat16)
    try:
        flashgrad.flash_attn_fp8_func(x, x, x)
    except NotImplementedError:
        return True
    return False


@pytest.mark.gpu
def test_fp8_demo_runs_or_says_fp8_is_missing(tmp_path):
    import flashgrad
    command = [sys.executable, "-m", "flashgrad.demo", "--quick", "--device", "cuda", "--fp8",
               "--out", str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if "flash_attn_fp8_func" in dir(flashgrad) and not _cuda_refuses_fp8(flashgrad):
        assert run.returncode == 0, f"demo failed:\n{run.stdout}\n{run.stderr}"
        log = json.loads((tmp_path / "log.json").read_text())
        assert log["kernels"] == "flashgrad-fp8" and log["gradient_check"]["passed"]
    else:
        assert run.returncode == 2
        assert "fp8 attention is not available in this build of flashgrad" in run.stderr


def _with_scaled_gate_gradient(kernels: Kernels, factor: float) -> Kernels:
    """The same forward, but the gradient reaching the decay gate g is multiplied by factor."""
    def wrong(q, k, v, g, beta):
        g = g + (g - g.detach()) * (factor - 1.0)  # value unchanged, d/dg scaled
        return reference_ops.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm=True)
    return Kernels("wrong-dg", kernels.attention, wrong, wrong)


def test_gradient_check_catches_a_slightly_wrong_gradient():
    config = ModelConfig(vocab_size=10)
    right = check_layer("chunk_gdn", config, reference_kernels(), batch=2, steps=37,
                        device=torch.device("cpu"), seed=11)
    assert right.passed and right.worst == 0.0

    wrong = check_layer("chunk_gdn", config, _with_scaled_gate_gradient(reference_kernels(), 1.001),
                        batch=2, steps=37, device=torch.device("cpu"), seed=11)
    assert not wrong.passed
    assert wrong.out == 0.0                              # the forward is right ...
    assert wrong.worst_op_input == "g"                   # ... dg 0.1% off is caught
    assert wrong.d_op_inputs == pytest.approx(1e-3, rel=1e-3)
    assert wrong.weight_errors["A_log"] > 1e-4           # and shows in the weights it feeds


def test_gradient_check_catches_a_dropped_gradient():
    def no_beta_gradient(q, k, v, g, beta):
        return reference_ops.gated_delta_rule(q, k, v, g, beta.detach(), use_qk_l2norm=True)
    kernels = Kernels("no-dbeta", reference_kernels().attention, no_beta_gradient, no_beta_gradient)
    with pytest.raises(RuntimeError, match="no gradient reached the op inputs beta"):
        check_layer("recurrent_gdn", ModelConfig(vocab_size=10), kernels, batch=1, steps=9,
                    device=torch.device("cpu"), seed=5)


def test_fp8_on_the_cpu_is_refused_with_a_message(tmp_path, capsys):
    assert main(["--fp8", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "fp8 attention runs on a GPU only" in capsys.readouterr().err


def test_fp8_without_the_op_names_what_is_missing(monkeypatch):
    """The GPU branch of --fp8, reached on any machine by claiming a CUDA build."""
    import flashgrad
    from flashgrad.demo.kernels import KernelsUnavailable, flashgrad_kernels
    if "flash_attn_fp8_func" in dir(flashgrad):
        pytest.skip("this build has flash_attn_fp8_func: test_fp8_demo_runs_or_says_fp8_is_missing covers it")
    monkeypatch.setattr(flashgrad, "build_info", lambda: {"cuda": True})
    with pytest.raises(KernelsUnavailable, match="fp8 attention is not available in this build of "
                                                 "flashgrad .no flashgrad.flash_attn_fp8_func"):
        flashgrad_kernels(torch.device("cuda"), fp8=True)


def test_attention_reference_matches_torch_sdpa_without_softcap():
    """The oracle itself: without softcap its output is PyTorch's own causal SDPA (GQA expanded)."""
    q = torch.randn(2, 19, 4, 16, dtype=torch.float64)
    k = torch.randn(2, 19, 2, 16, dtype=torch.float64)
    v = torch.randn(2, 19, 2, 16, dtype=torch.float64)
    out, lse = reference_ops.softmax_attention(q, k, v, softcap=0.0, causal=True)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(2, dim=2).transpose(1, 2),
        v.repeat_interleave(2, dim=2).transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out.float(), expected.float(), rtol=1e-5, atol=1e-5)
    assert lse.shape == (2, 4, 19)
