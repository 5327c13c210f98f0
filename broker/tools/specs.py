"""The sandbox tools' names, descriptions and parameters: one source for the MCP server (mcp_server/server.py
builds its tools' signatures from these aliases) and for the tool definitions any LLM API takes.

Each parameter is an `Annotated` alias carrying its pydantic `Field` (constraints and description); a tool's
arguments are a model of those aliases that refuses unknown fields. The LLM definitions have no `session`:
the host application passes its conversation id to the dispatcher, while MCP clients pass it as an argument.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from broker.sandbox.paths import inside_workspace

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_READ_BYTES = 64 * 1024
DEFAULT_LIST_DEPTH = 2
MAX_WRITE_BYTES = 1536 * 1024
"""write_files carries at most this much per call (MCP's files travel as job arguments, which Linux caps near
2 MiB in all); the model splits a larger write over several calls."""

Command = Annotated[str, Field(min_length=1, max_length=100_000, description="Shell command (bash -c).")]
Cwd = Annotated[str | None, Field(default=None, max_length=4096, description="Directory relative to the workspace.")]
Env = Annotated[dict[str, str] | None, Field(default=None, description="Extra environment variables.")]
CommandTimeout = Annotated[float, Field(gt=0, le=3600, description="Kill the command after this many seconds; the "
                                                                   "partial output comes back with timed_out true.")]
Code = Annotated[str, Field(min_length=1, max_length=100_000, description="Python source.")]
CodeTimeout = Annotated[float, Field(gt=0, le=3600, description="Interrupt the code after this many seconds (the "
                                                                "kernel and its state stay).")]
FilePath = Annotated[str, Field(min_length=1, max_length=4096, description="Relative to the workspace.")]
Offset = Annotated[int, Field(ge=0)]
MaxBytes = Annotated[int, Field(ge=1, le=1 << 20)]
DirPath = Annotated[str, Field(min_length=1, max_length=4096)]
Depth = Annotated[int, Field(ge=1, le=10)]


class FileIn(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    path: str = Field(min_length=1, max_length=4096, description="Path relative to the workspace.")
    text: str | None = None
    base64: str | None = None

    @model_validator(mode="after")
    def _one_body(self) -> FileIn:
        if (self.text is None) == (self.base64 is None):
            raise ValueError("give exactly one of `text` or `base64`")
        return self

    def data(self) -> str | bytes:
        return self.text if self.text is not None else base64.b64decode(self.base64 or "")


Files = Annotated[list[FileIn], Field(min_length=1, max_length=200)]


def check_files(files: list[FileIn]) -> None:
    """What write_files refuses before anything runs (ValueError saying why): too many bytes, a path outside
    the workspace (OutsideWorkspace, a ValueError), a `base64` that is not base64."""
    size = sum(len(f.text or "") + len(f.base64 or "") for f in files)
    if size > MAX_WRITE_BYTES:
        raise ValueError(f"write_files carries at most {MAX_WRITE_BYTES} bytes per call ({size} given): "
                         "split it over several calls")
    for i, f in enumerate(files):
        inside_workspace(f.path, f"files[{i}].path")
        if f.base64 is not None:
            try:
                base64.b64decode(f.base64, validate=True)
            except (ValueError, binascii.Error) as exc:
                raise ValueError(f"{f.path}: `base64` is not valid base64") from exc


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a model's NaN is not a timeout


class RunArgs(_Args):
    command: Command
    cwd: Cwd = None
    env: Env = None
    timeout_s: CommandTimeout = DEFAULT_TIMEOUT_S


class PythonArgs(_Args):
    code: Code
    timeout_s: CodeTimeout = DEFAULT_TIMEOUT_S


class WriteArgs(_Args):
    files: Files


class ReadArgs(_Args):
    path: FilePath
    offset: Offset = 0
    max_bytes: MaxBytes = DEFAULT_READ_BYTES


class ListArgs(_Args):
    path: DirPath = "."
    depth: Depth = DEFAULT_LIST_DEPTH


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[BaseModel]

    def schema(self) -> dict[str, Any]:
        """The arguments' JSON schema (what MCP's inputSchema holds, less `session`)."""
        schema = self.args.model_json_schema()
        schema["title"] = f"{self.name}Arguments"
        return schema


SPECS: dict[str, ToolSpec] = {s.name: s for s in (
    ToolSpec("run_in_sandbox", "Run a shell command in the conversation's warm sandbox and return its exit code "
                               "and output. The workspace (the starting directory) keeps its files for the "
                               "whole conversation.", RunArgs),
    ToolSpec("python_exec", "Run Python in the conversation's live kernel (an IPython kernel in the sandbox): every "
                            "object stays in memory between calls, models on the GPU and open files included. The "
                            "final expression's value, images (matplotlib), DataFrames (as markdown) and other "
                            "rich output come back. An idle kernel ends after the pool's keep-alive; the next call "
                            "restores what could be pickled and says which names were lost.", PythonArgs),
    ToolSpec("write_files", "Write files (UTF-8 `text` or `base64`) into the sandbox's workspace; parents are "
                            "created.", WriteArgs),
    ToolSpec("read_file", "Read (part of) a file of the sandbox's workspace; images also come back as "
                          "images.", ReadArgs),
    ToolSpec("list_files", "List files under a directory of the sandbox's workspace (paths relative to the "
                           "workspace).", ListArgs),
)}
"""The tools an LLM calls, in the order the definitions list them."""

FORMATS = ("openai", "openai-responses", "anthropic", "json")


def definitions(format: str = "json", names: list[str] | tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The tools' definitions in `format`: "openai" (Chat Completions `tools`), "openai-responses" (the
    Responses API's), "anthropic" (Messages API `tools`) or "json" (name, description, JSON-schema parameters);
    `names` picks some of them."""
    if format not in FORMATS:
        raise ValueError(f"unknown tool definition format {format!r}: use one of {', '.join(FORMATS)}")
    chosen = list(SPECS) if names is None else list(names)
    unknown = [n for n in chosen if n not in SPECS]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(map(repr, unknown))}: the tools are {', '.join(SPECS)}")
    out: list[dict[str, Any]] = []
    for name in chosen:
        spec = SPECS[name]
        if format == "openai":
            out.append({"type": "function", "function": {"name": name, "description": spec.description,
                                                          "parameters": spec.schema()}})
        elif format == "openai-responses":
            out.append({"type": "function", "name": name, "description": spec.description,
                        "parameters": spec.schema()})
        elif format == "anthropic":
            out.append({"name": name, "description": spec.description, "input_schema": spec.schema()})
        else:
            out.append({"name": name, "description": spec.description, "parameters": spec.schema()})
    return out
