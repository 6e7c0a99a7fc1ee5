"""README.md runs as written.

Every ```python block of README.md is run on its own (a fresh namespace, as a reader pastes it):
on CPU here, where the ops run the float64 reference, on the GPU where there is one. A block that
needs a GPU is marked by an HTML comment `<!-- gpu -->` on the line before its fence and is
skipped without one. The README's install and test commands are the ones CI runs (.ci/run), and
the test requirements file and the `test` extra list the same packages.
"""
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^(?P<mark><!-- gpu -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


def blocks(lang):
    """(line number, needs a GPU, source) of every ```lang block."""
    return [(README.count("\n", 0, m.start("body")) + 1, bool(m.group("mark")), m.group("body"))
            for m in FENCE.finditer(README) if m.group("lang") == lang]


PYTHON = blocks("python")


def test_readme_has_python_blocks():
    assert len(PYTHON) >= 4, "README.md: expected the Python usage blocks"


@pytest.mark.parametrize("line,gpu,source", PYTHON, ids=[f"line{b[0]}" for b in PYTHON])
def test_python_block_runs(line, gpu, source):
    if gpu and not torch.cuda.is_available():
        pytest.skip("README block marked <!-- gpu -->: needs a CUDA device")
    code = compile(source, f"README.md:{line}", "exec")
    exec(code, {"__name__": f"readme_line{line}"})


def test_install_and_test_commands_are_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    install, test = (body.strip() for _, _, body in blocks("bash")[:2])
    assert "pip install --no-build-isolation ." in install
    assert "scripts/test.sh" in test
    for command in (install, test):
        # the command as written, on a line of its own (`|| exit 1`: set -e does not stop in an && list)
        line = re.compile(rf"^{re.escape(command)}( \|\| exit 1\b.*)?$", re.M)
        assert line.search(ci), f".ci/run must run the README command as written: {command}"


def test_test_requirements_match_the_test_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    reqs = [ln.strip() for ln in (ROOT / "tests" / "requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert sorted(reqs) == sorted(extra)
