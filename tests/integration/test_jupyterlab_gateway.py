"""A real JupyterLab, with nothing of ours installed beside it, pointed at the broker as its Jupyter gateway
(`jupyter lab --gateway-url=<broker> --GatewayClient.auth_token=<token>`), driven in headless Chromium:
open a notebook, pick the Firepool kernel, run a cell that prints, see the output. The kernel runs in a
sandbox; JupyterLab reaches it only through the broker's URL (REST + the kernel websocket)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import BrokerProcess, free_port
from tests.integration.test_dashboard import CHROMEDRIVER, CHROMIUM

pytestmark = pytest.mark.integration

POOLS = """pools:
  - {name: cpu, max_count: 2}
"""
TIMEOUT = 90.0


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    b: BrokerProcess = broker_factory(pools=POOLS)
    return b


@pytest.fixture
def lab(broker: BrokerProcess, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`jupyter lab` in gateway mode against the broker, alice's token; (its URL, its own token)."""
    port, token = free_port(), secrets.token_hex(16)
    root = tmp_path / "notebooks"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FIREPOOL_", "JUPYTER_"))}
    env.update({"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
                "JUPYTER_CONFIG_DIR": str(tmp_path / "jcfg"), "JUPYTER_DATA_DIR": str(tmp_path / "jdata"),
                "JUPYTER_RUNTIME_DIR": str(tmp_path / "jrun"), "HOME": str(tmp_path)})
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={root}", "--ServerApp.terminals_enabled=False",
           f"--gateway-url={broker.url}", f"--GatewayClient.auth_token={broker.tokens['alice']}",
           "--GatewayClient.auth_scheme=Bearer", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
           "jupyterlab.NeverCheckForUpdate"]
    log_path = tmp_path / "lab.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/api/status", headers={"Authorization": f"token {token}"},
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield url, token
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def chromium() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(60)
    yield d
    d.quit()


def wait_for(d: Any, css: str, timeout: float = TIMEOUT) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(d, timeout).until(ec.element_to_be_clickable((By.CSS_SELECTOR, css)))


@pytest.mark.timeout(300)
def test_jupyterlab_with_the_broker_as_gateway_runs_a_cell_in_a_firepool_kernel(
        broker: BrokerProcess, lab: tuple[str, str], chromium: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    url, token = lab
    with httpx.Client(base_url=url, headers={"Authorization": f"token {token}"}, timeout=TIMEOUT) as http:
        specs = http.get("/api/kernelspecs").json()
        assert "firepool-cpu" in specs["kernelspecs"], specs  # JupyterLab lists the broker's kernelspecs
        display = specs["kernelspecs"]["firepool-cpu"]["spec"]["display_name"]
        http.put("/api/contents/probe.ipynb", json={"type": "notebook", "content": {
            "cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}})

    chromium.get(f"{url}/lab/tree/probe.ipynb?token={token}")
    # A notebook without a kernel asks which one: pick the Firepool kernel in the dialog.
    select = wait_for(chromium, ".jp-Dialog select")
    options = [o.text for o in select.find_elements(By.TAG_NAME, "option")]
    assert display in options, options
    Select(select).select_by_visible_text(display)
    wait_for(chromium, ".jp-Dialog .jp-mod-accept").click()
    WebDriverWait(chromium, TIMEOUT).until(  # the kernel started through the broker and answered
        lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator[data-status='idle']"))

    editor = wait_for(chromium, ".jp-Notebook .jp-Cell .cm-content")
    editor.click()
    editor.send_keys("import os; print('hello from', os.environ['FIREPOOL_POD'], os.environ['FIREPOOL_CALLER'], 6 * 7)")
    editor.send_keys(Keys.SHIFT, Keys.ENTER)
    out = WebDriverWait(chromium, TIMEOUT).until(
        lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output") if "42" in e.text])
    # The kernel that ran it is the broker's: alice's gateway kernel, a kernel job in a sandbox of pool cpu.
    assert len(out[0].split()) == 5, out
    pod_name, caller, answer = out[0].split()[2:]
    assert (caller, answer) == ("alice", "42")
    pod = next(p for p in broker.client("ops").get("/v1/pods").json()["pods"] if p["name"] == pod_name)
    job = broker.client("alice").get(f"/v1/jobs/{pod['job']}").json()
    assert (pod["pool"], job["caller"], job["state"]) == ("cpu", "alice", "RUNNING")
    assert [k["name"] for k in broker.client("alice").get("/api/kernels").json()] == ["firepool-cpu"]
