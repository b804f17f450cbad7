"""Make PyPI's CUDA torchvision importable on the CPU torch that vLLM's CPU build pins (the why:
docs/images.md, why `.venv` carries a `.pth` file).

    install()   # from the venv's .pth file, in every interpreter

Rules:
- when torchvision's C library does not load, the schemas of `torchvision::nms` and
  `torchvision::qnms` (no kernels) are defined before its first import, so its fake-kernel
  registrations do not fail; image preprocessing uses neither op;
- `install()` puts a finder on `sys.meta_path` that costs nothing (not even a torch import)
  until `torchvision` is first imported; it must run before vLLM imports its API server, so
  only a `.pth` file (`make venv`) is early enough;
- its test fails once a torchvision imports without it: then delete this module and the
  Makefile's `.pth` line.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The ops torchvision 0.28 registers fake kernels for without checking that its C library
# loaded, with their schemas as torchvision's csrc/ops/nms.cpp declares them.
MISSING_OP_SCHEMAS = {
    "nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
# The .pth line `make venv` writes into site-packages (sorted after setuptools' editable
# finder, which must be in place before `serving` can be imported).
PTH_NAME = "qwen_serving_torchvision_compat.pth"
PTH_LINE = (
    "import importlib.util as u; u.find_spec('serving') and "
    "__import__('serving.engine.torchvision_compat').engine.torchvision_compat.install()\n"
)


class TorchvisionCompatFinder:
    """A meta path finder that finds nothing: it only runs `define_missing_ops` once, just
    before the first `import torchvision` is resolved by the real finders."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision":
            uninstall()
            define_missing_ops()
        return None


def install() -> None:
    """Prepare `import torchvision` in this interpreter (idempotent; lazy: imports nothing)."""
    if "torchvision" in sys.modules or _installed():
        return
    sys.meta_path.insert(0, TorchvisionCompatFinder())


def write_pth(site_packages: Path | None = None) -> Path:
    """Write the .pth file that runs `install()` at every start of this interpreter's venv."""
    directory = site_packages or Path(sysconfig.get_path("purelib"))
    path = directory / PTH_NAME
    path.write_text(PTH_LINE, encoding="utf-8")
    return path


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, TorchvisionCompatFinder)]


def _installed() -> bool:
    return any(isinstance(finder, TorchvisionCompatFinder) for finder in sys.meta_path)


def _extension_path() -> Path | None:
    """torchvision's C library (`_C.so`), found without importing torchvision."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            candidate = Path(location) / f"_C{suffix}"
            if candidate.is_file():
                return candidate
    return None


def define_missing_ops() -> list[str]:
    """Define the schemas of MISSING_OP_SCHEMAS that torchvision's C library would have.

    Returns the ops it defined: none where torchvision is absent or its library loads (it
    loads it as torchvision itself would, so torchvision's own attempt finds it loaded).
    """
    library = _extension_path()
    if library is None:
        return []
    import torch

    try:
        torch.ops.load_library(str(library))
        return []
    except OSError:
        pass  # a CUDA build on the CPU torch: define what torchvision registers fakes for
    defined = []
    for name, schema in MISSING_OP_SCHEMAS.items():
        if not _op_exists(name):
            # torch.library.define keeps the library alive for the life of the process.
            torch.library.define(f"torchvision::{name}", schema)
            defined.append(name)
    return defined


def _op_exists(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.torchvision, name)
    except (AttributeError, RuntimeError):
        return False
    return True


if __name__ == "__main__":  # `make venv`: python -m serving.engine.torchvision_compat
    print(write_pth())
