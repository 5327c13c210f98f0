"""CLI conventions: --version, a bare command prints help, every option says what it does and its default,
kernelspecs can be listed and removed, tables keep each row on one line."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from broker.cli import HelpFormatter, build_parser, main, package_version
from broker.cli_output import one_line_command, print_table

OWNED_ELSEWHERE = {"mcp"}
"""`firepool mcp`'s options are declared by mcp_server.main (their help is that module's)."""


def subparsers(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"{prefix}{name}"] = sub
                found.update(subparsers(sub, f"{prefix}{name} "))
    return found


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"firepool {package_version()}"


@pytest.mark.parametrize("argv", [[], ["kernelspec"]])
def test_a_bare_command_prints_its_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: firepool") and "options:" in err


def test_every_option_has_help_and_shows_its_default() -> None:
    for name, sub in subparsers(build_parser()).items():
        if name in OWNED_ELSEWHERE:
            continue
        assert sub.formatter_class is HelpFormatter, name
        text = sub.format_help()
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, f"firepool {name} {action.option_strings[0]} has no help text"
            shown = action.default not in (None, False, "", []) and action.default is not argparse.SUPPRESS
            if shown:
                assert "default" in (action.help or "") or f"(default: {action.default})" in " ".join(text.split()), \
                    f"firepool {name} {action.option_strings[0]} does not show its default {action.default!r}"


def test_kernelspecs_are_listed_and_uninstalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("jupyter_client")
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FIREPOOL_URL", "http://broker.example:8321")
    assert main(["kernelspec", "install", "--pool", "cpu", "--user"]) == 0
    capsys.readouterr()
    assert main(["kernelspec", "list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split()[:2] == ["NAME", "POOL"]
    assert any(r.split()[:2] == ["firepool-cpu", "cpu"] for r in rows[1:])
    assert main(["kernelspec", "uninstall", "firepool-nosuch"]) == 1
    assert "no Firepool kernelspec named firepool-nosuch" in capsys.readouterr().err
    assert main(["kernelspec", "uninstall", "firepool-cpu"]) == 0
    assert not (tmp_path / "kernels" / "firepool-cpu").exists()


def test_a_command_shows_on_one_line_shortened() -> None:
    assert one_line_command(["python3", "-c", "import os\nprint(1)"]) == "python3 -c 'import os⏎print(1)'"
    long = one_line_command(["sh", "-c", "x" * 200])
    assert len(long) == 48 and long.endswith("…")


def test_tables_are_aligned_without_colour_when_piped() -> None:
    out = io.StringIO()
    print_table([("j-1", "SUCCEEDED", 0), ("j-22222", "FAILED", 137)], ("ID", "STATE", "EXIT"), right=("EXIT",),
                stream=out)
    lines = out.getvalue().splitlines()
    assert "\x1b[" not in out.getvalue() and len(lines) == 3
    assert {line.index("STATE") if i == 0 else line.index(s) for i, (line, s) in
            enumerate(zip(lines, ("STATE", "SUCCEEDED", "FAILED"), strict=True))} == {lines[0].index("STATE")}
    assert lines[1].rstrip().endswith("  0") and lines[2].rstrip().endswith("137")
