"""The torchvision shim: still needed, installed in every interpreter of the venv, harmless."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from serving.engine import torchvision_compat
from serving.engine.torchvision_compat import PTH_LINE, PTH_NAME, TorchvisionCompatFinder


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_shim_is_still_needed() -> None:
    """Fails once a torchvision arrives that imports on this torch by itself: then delete
    serving/engine/torchvision_compat.py, its .pth step in the Makefile and this test."""
    done = run_python(
        "from serving.engine import torchvision_compat as c; c.uninstall(); import torchvision"
    )
    assert "No module named 'torchvision'" not in done.stderr, "run `make venv`"
    assert done.returncode != 0, (
        "torchvision now imports without serving/engine/torchvision_compat.py: remove the shim"
    )
    assert "operator torchvision::nms does not exist" in done.stderr, done.stderr[-2000:]


def test_every_interpreter_of_the_venv_imports_transformers_models_and_vllms_server() -> None:
    """What broke when torchvision was installed: transformers' model classes (the tiny
    model builders, AWQ, the tokenizer tests) and vLLM's API server, which imports torchvision
    before it loads any plugin. A fresh interpreter gets the shim from the .pth file."""
    assert (Path(sysconfig.get_path("purelib")) / PTH_NAME).read_text() == PTH_LINE, (
        "run `make venv`: it writes the .pth file"
    )
    done = run_python(
        "import sys\n"
        "from transformers import Qwen2VLImageProcessor, Qwen3ForCausalLM\n"
        "import vllm.entrypoints.openai.api_server\n"
        "import torch\n"
        "assert 'torchvision' in sys.modules\n"
        "try:\n"
        "    torch.ops.torchvision.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)\n"
        "except NotImplementedError:\n"
        "    print('nms has no CPU kernel')\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nms has no CPU kernel" in done.stdout


def test_install_is_idempotent_and_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Other tests of the suite may have imported torchvision already; install() then rightly
    # does nothing, so the finder is checked as in a fresh interpreter.
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    before = list(sys.meta_path)
    try:
        torchvision_compat.uninstall()
        torchvision_compat.install()
        torchvision_compat.install()
        finders = [f for f in sys.meta_path if isinstance(f, TorchvisionCompatFinder)]
        assert len(finders) == 1
        # It finds nothing itself: other modules resolve as before.
        assert finders[0].find_spec("json", None) is None
    finally:
        sys.meta_path[:] = before


def test_the_pth_line_is_what_write_pth_writes(tmp_path: Path) -> None:
    written = torchvision_compat.write_pth(tmp_path)
    assert written == tmp_path / PTH_NAME
    assert written.read_text() == PTH_LINE
    # site.py runs a .pth line that starts with "import" as one statement.
    assert PTH_LINE.startswith("import ") and PTH_LINE.count("\n") == 1
