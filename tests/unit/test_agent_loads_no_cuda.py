"""A standby runs only the pod agent, so the agent must never load a CUDA (or NVML) library itself."""

from __future__ import annotations

import ast
from pathlib import Path

import firepool_agent

GPU_MODULES = {"torch", "cupy", "pynvml", "nvidia", "numba", "jax", "tensorflow", "pycuda", "cuda"}


def agent_sources() -> list[Path]:
    return sorted(Path(firepool_agent.__file__).parent.glob("*.py"))


def gpu_loads(tree: ast.AST) -> list[str]:
    """Imports of GPU frameworks, and ctypes library loads of anything but the process's own symbols."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in GPU_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in GPU_MODULES:
            found.append(node.module or "")
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.endswith(("CDLL", "LoadLibrary", "PyDLL")) and not (
                    node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
                found.append(ast.unparse(node))
    return found


def test_the_check_catches_a_cuda_load() -> None:
    code = "import ctypes\nimport torch\nctypes.CDLL('libcuda.so.1')\nctypes.CDLL(None)\n"
    assert gpu_loads(ast.parse(code)) == ["torch", "ctypes.CDLL('libcuda.so.1')"]


def test_the_pod_agent_imports_no_gpu_library() -> None:
    sources = agent_sources()
    assert len(sources) >= 5
    offenders = {p.name: gpu_loads(ast.parse(p.read_text())) for p in sources}
    assert {name: found for name, found in offenders.items() if found} == {}
