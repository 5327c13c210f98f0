"""An attempt's logs live on the pod's capped disk: a full disk stops the logs, never the pump."""

from __future__ import annotations

import os
from pathlib import Path

from firepool_agent.output import Output


def test_a_full_log_disk_keeps_what_was_written_and_drains_the_rest(tmp_path: Path) -> None:
    output = Output(tmp_path / "attempt", changed=lambda: None)
    output._create()
    output._append("stdout", b"before\n")
    full = os.open("/dev/full", os.O_WRONLY)  # every write fails ENOSPC, as on a filled ext4 image
    os.dup2(full, output._fds["stdout"])
    os.close(full)
    output._append("stdout", b"lost\n")  # raised OSError out of the pump thread before
    output._append("stderr", b"dropped too\n")
    assert output.error is not None and "No space left" in output.error
    assert output.read("stdout", 0, 100) == b"before\n" and output.sizes["combined"] == 7
    output.close()
