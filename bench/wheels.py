"""Tiny pure-Python wheels written directly, for dependency installs that never touch the network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def write_wheel(directory: Path, name: str, version: str, payload: int = 0) -> Path:
    """`<name>-<version>-py3-none-any.whl` whose module reports VERSION; `payload` adds that many bytes."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: firepool\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if payload:
        files[f"{name}/data.py"] = "DATA = " + repr("x" * payload) + "\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    target = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return target
