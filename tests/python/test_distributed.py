"""kernelforge under torch.distributed (kernelforge/distributed.py, the tensor-parallel loss patch).

The multi-rank checks live in tests/distributed/checks.py and run here through torchrun: on the CPU with
gloo (2 ranks: every check; 4 ranks: FSDP2 x TP on a real 2 x 2 mesh), and on CUDA with NCCL when there
are two GPUs (two ranks on one GPU through gloo crash inside torch's functional collectives). The
in-process tests cover a one-rank group, argument errors and the registration of the DTensor rules.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist

CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "distributed", "checks.py")


def _torchrun(nproc: int, device: str, *checks: str, timeout: int = 900) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", CHECKS,
           "--device", device, *checks]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{out[-6000:]}"
    return r.stdout


@pytest.mark.parametrize("check", ["ops", "ce", "train"])
def test_two_ranks_cpu(check):
    out = _torchrun(2, "cpu", check)
    assert {"ops": "ops: ", "ce": "ce: ", "train": "train FSDP2 1 x TP=2: "}[check] in out, out


def test_fsdp_by_tp_2x2_cpu():
    out = _torchrun(4, "cpu", "train")
    assert "FSDP2 2 x TP=2" in out


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two GPUs: NCCL takes one GPU per rank")
def test_two_ranks_cuda():
    out = _torchrun(2, "cuda", "ops", "ce", "train")
    assert "ops:" in out and "ce:" in out and "FSDP2 1 x TP=2" in out


# ---- one process -----------------------------------------------------------------------------------------------


@pytest.fixture
def one_rank_group():
    """A world of one process (gloo, a file store): the collectives are identities."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    path = tempfile.mktemp(prefix="kf_dist_")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    if os.path.exists(path):
        os.remove(path)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_one_rank_matches_cross_entropy(kf, one_rank_group, device):
    x = (torch.randn(9, 50, device=device) * 2).requires_grad_()
    t = torch.randint(0, 50, (9,), device=device)
    t[4] = -100
    want = kf.cross_entropy(x, t, label_smoothing=0.1, z_loss_scale=1e-3)
    (gx,) = torch.autograd.grad(want, x)
    got = kf.vocab_parallel_cross_entropy(x, t, label_smoothing=0.1, z_loss_scale=1e-3)
    (gx2,) = torch.autograd.grad(got, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx2, gx, rtol=1e-5, atol=1e-6)
    # a shard of a larger vocabulary: the other classes' logits count as absent (-inf)
    got = kf.vocab_parallel_cross_entropy(x, t, class_start=0, num_classes=50)
    torch.testing.assert_close(got, kf.cross_entropy(x, t), rtol=1e-5, atol=1e-5)


def test_one_rank_fused_matches(kf, one_rank_group):
    h = torch.randn(11, 16, requires_grad=True)
    w = torch.randn(40, 16, requires_grad=True)
    t = torch.randint(0, 40, (11,))
    want = kf.cross_entropy(h @ w.t(), t, reduction="sum")
    gh, gw = torch.autograd.grad(want, (h, w))
    got = kf.vocab_parallel_fused_linear_cross_entropy(h, w, t, reduction="sum", chunk_tokens=4)
    gh2, gw2 = torch.autograd.grad(got, (h, w))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(gh2, gh, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw2, gw, rtol=1e-5, atol=1e-5)


def test_one_rank_fused_edges(kf, one_rank_group):
    """No tokens; [B, S, H] hidden states; a second backward through the same graph (retain_graph: the
    chunks are recomputed, the gradients add up)."""
    w = torch.randn(10, 4, requires_grad=True)
    loss = kf.vocab_parallel_fused_linear_cross_entropy(torch.randn(0, 4), w, torch.zeros(0, dtype=torch.long),
                                                        reduction="sum")
    loss.backward()
    assert loss.item() == 0 and w.grad.abs().sum().item() == 0
    h = torch.randn(2, 3, 4, requires_grad=True)
    t = torch.randint(0, 10, (2, 3))
    want = kf.cross_entropy(h @ w.t(), t, label_smoothing=0.1)
    (gh,) = torch.autograd.grad(want, h)
    loss = kf.vocab_parallel_fused_linear_cross_entropy(h, w, t, label_smoothing=0.1)
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    loss.backward(retain_graph=True)
    g1 = h.grad.clone()
    torch.testing.assert_close(g1, gh, rtol=1e-5, atol=1e-6)
    (loss * 3).backward()
    torch.testing.assert_close(h.grad, 4 * g1, rtol=1e-5, atol=1e-6)


def test_errors(kf, one_rank_group):
    x, t = torch.randn(4, 8), torch.randint(0, 8, (4,))
    with pytest.raises(ValueError, match="reduction must be"):
        kf.vocab_parallel_cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="pass both class_start and num_classes"):
        kf.vocab_parallel_cross_entropy(x, t, class_start=0)
    with pytest.raises(ValueError, match=r"must lie in \[0, num_classes = 10\)"):
        kf.vocab_parallel_cross_entropy(x, t, class_start=4, num_classes=10)
    with pytest.raises(ValueError, match="target must have the shape"):
        kf.vocab_parallel_cross_entropy(x, t[:3])
    with pytest.raises(ValueError, match="softcap must be None or > 0"):
        kf.vocab_parallel_cross_entropy(x, t, softcap=0.0)
    with pytest.raises(ValueError, match=r"weight must be \[V_r, 8\]"):
        kf.vocab_parallel_fused_linear_cross_entropy(x, torch.randn(8, 5), t)
    with pytest.raises(ValueError, match="bias must be"):
        kf.vocab_parallel_fused_linear_cross_entropy(x, torch.randn(6, 8), t, torch.randn(5))
    with pytest.raises(ValueError, match="must have hidden's dtype"):
        kf.vocab_parallel_fused_linear_cross_entropy(x, torch.randn(6, 8, dtype=torch.float64), t)
    # the core's own check of the shard range, through the op
    with pytest.raises(RuntimeError, match="vocabulary shard must lie inside the classes"):
        torch.ops.kernelforge.cross_entropy_shard(x, t, 6, 10, -100, 0.0, 0.0)


def test_needs_a_process_group(kf):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        kf.vocab_parallel_cross_entropy(torch.randn(2, 4), torch.zeros(2, dtype=torch.long))


def test_dtensor_rules_register_on_import():
    """The rules are registered whether torch.distributed.tensor is imported before or after kernelforge."""
    code = """
import sys, torch
{first}
{second}
from torch.distributed.tensor import DTensor
rules = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
k = torch.ops.kernelforge
assert k.rms_norm.default in rules and k.apply_rope_backward.default in rules, "not registered"
print("ok")
"""
    for first, second in (("import kernelforge", "import torch.distributed.tensor"),
                          ("import torch.distributed.tensor", "import kernelforge")):
        r = subprocess.run([sys.executable, "-c", code.format(first=first, second=second)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0 and "ok" in r.stdout, f"{first}; {second}:\n{r.stdout}{r.stderr[-3000:]}"


def test_kernelforge_import_does_not_import_dtensor():
    code = "import sys, kernelforge; print('torch.distributed.tensor' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr[-2000:]


def test_kforge_dist_cpu(tmp_path):
    """`kforge dist` end to end on the CPU (small sizes, 2 ranks): every job runs and writes its row."""
    import csv

    cmd = [sys.executable, "-m", "kernelforge.cli", "dist", "--size", "small", "--device", "cpu", "--warmup", "1",
           "--iters", "1", "--cases", "fsdp_train,tp_train,vp_ce", "--providers", "eager,kernelforge,loss_parallel",
           "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ, OMP_NUM_THREADS="1"))
    rows = list(csv.DictReader(open(tmp_path / "dist.csv"))) if (tmp_path / "dist.csv").exists() else []
    errors = [f"{x['case']} {x['provider']}: {x['status']}" for x in rows if x["status"] != "ok"]
    assert r.returncode == 0, f"exit {r.returncode}; failed jobs: {errors}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert [(x["case"], x["provider"], x["status"]) for x in rows] == [
        ("fsdp_train", "eager", "ok"), ("fsdp_train", "kernelforge", "ok"), ("tp_train", "eager", "ok"),
        ("tp_train", "kernelforge", "ok"), ("vp_ce", "eager", "ok"), ("vp_ce", "loss_parallel", "ok"),
        ("vp_ce", "kernelforge", "ok")]
    assert all(float(x["ms_per_step"]) > 0 for x in rows)
