"""Shared fixtures for the kernelforge Python tests.

GPU policy: tests that need CUDA carry the `cuda` marker (parametrized device "cuda" gets it
automatically). Without a GPU they are skipped, unless KF_REQUIRE_GPU=1: then a missing GPU stops
the session with an error and any skipped GPU test is reported as a failure, so a GPU CI job can
never pass by skipping its GPU tests.
"""

from __future__ import annotations

import os

import pytest
import torch

REQUIRE_GPU = os.environ.get("KF_REQUIRE_GPU") == "1"
HAS_CUDA = torch.cuda.is_available()

def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA GPU (skipped without one; a failure when KF_REQUIRE_GPU=1)"
    )


def pytest_sessionstart(session):
    if REQUIRE_GPU and not HAS_CUDA:
        pytest.exit("KF_REQUIRE_GPU=1 but torch.cuda.is_available() is False", returncode=1)


def _uses_cuda(item) -> bool:
    if item.get_closest_marker("cuda") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    return any(isinstance(v, (str, torch.device)) and str(v).startswith("cuda") for v in callspec.params.values())


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _uses_cuda(item) and item.get_closest_marker("cuda") is None:
            item.add_marker(pytest.mark.cuda)


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None and not HAS_CUDA:
        if REQUIRE_GPU:
            pytest.fail("KF_REQUIRE_GPU=1 but no CUDA GPU is available", pytrace=False)
        pytest.skip("needs a CUDA GPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module skipped at import (e.g. a module-level importorskip) may hold GPU tests that would
    # then never run: with KF_REQUIRE_GPU=1 that is a failure too.
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_GPU and rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = f"KF_REQUIRE_GPU=1: {collector.nodeid} was skipped at collection: {rep.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    # an xfail (a known failure of a dependency, named in its reason) is reported as such, not as a skip
    if REQUIRE_GPU and rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("cuda") is not None:
        rep.outcome = "failed"
        rep.longrepr = f"KF_REQUIRE_GPU=1: GPU test was skipped: {rep.longrepr}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def kf():
    import kernelforge

    return kernelforge


@pytest.fixture
def fresh_dynamo():
    """torch.compile tests start and end with dynamo's caches cleared (recompile counts are per test)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---- the plan of the last kernelforge launch in the report of every failed test ------------------------
# (a second pytest_runtest_makereport wrapper, named apart from the one above through specname)


@pytest.hookimpl(hookwrapper=True, specname="pytest_runtest_makereport")
def pytest_runtest_makereport_last_plan(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    import sys

    kf = sys.modules.get("kernelforge")  # never imported here: a test that did not import it launched nothing
    try:
        plan = (kf.last_plan() or "none (no launch on this thread)") if kf is not None else "none (not imported)"
    except Exception as e:  # noqa: BLE001  (the report must still be written)
        plan = f"unavailable ({type(e).__name__}: {e})"
    rep.sections.append(("kernelforge", f"last kernelforge plan: {plan}"))
