"""What decides whether a pre-started kernel may take a job: the env it depended on, the job's sys.path, the pool."""

from __future__ import annotations

import os
import site

import pytest

from broker.pools import CatalogError, load_catalog
from firepool_agent.kernel_bind import env_conflicts, job_sys_path


def test_a_job_env_that_only_adds_its_own_variables_binds() -> None:
    before = {"PATH": "/bin", "HOME": "/workspace", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": ""}
    job = {**before, "CUDA_VISIBLE_DEVICES": "0", "FIREPOOL_JOB_ID": "j1", "PYTHONPATH": "/agent:/deps"}
    assert env_conflicts(before, job, read={"PATH", "HOME"}) == []


@pytest.mark.parametrize(("change", "name"), [
    ({"PYTHONHASHSEED": "1"}, "PYTHONHASHSEED"),  # read by the interpreter before any import
    ({"HOME": "/elsewhere"}, "HOME"),
    ({"LC_ALL": "de_DE.UTF-8"}, "LC_ALL"),
    ({"PATH": "/deps/bin:/bin"}, "PATH"),  # read by an import (it is in `read`)
    ({"PYDEVD_USE_CYTHON": "NO"}, "PYDEVD_USE_CYTHON"),  # read while absent: setting it changes the start
])
def test_a_variable_the_start_depended_on_refuses_the_bind(change: dict[str, str], name: str) -> None:
    before = {"PATH": "/bin", "HOME": "/workspace", "LANG": "C.UTF-8"}
    assert env_conflicts(before, {**before, **change}, read={"PATH", "PYDEVD_USE_CYTHON"}) == [name]


BASE = ["/prestart-home", "/agent", "/usr/lib/python311.zip", "/usr/lib/python3.11", "/venv/site-packages"]


@pytest.fixture
def user_base(tmp_path, monkeypatch) -> str:
    """A user base of the job's (PYTHONUSERBASE), with user sites enabled as outside a venv."""
    monkeypatch.setattr(site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(site, "USER_BASE", None)
    monkeypatch.setattr(site, "USER_SITE", None)
    monkeypatch.setenv("PYTHONUSERBASE", str(tmp_path / "ub"))
    return str(tmp_path / "ub")


def test_the_job_path_is_a_fresh_interpreters_in_its_cwd(tmp_path, user_base) -> None:
    cwd = str(tmp_path / "ws")
    path, new = job_sys_path(cwd, "/agent:deps", BASE, dropped={"/prestart-home", "/agent"})
    deps = os.path.join(cwd, "deps")
    assert path == [cwd, "/agent", deps, "/usr/lib/python311.zip", "/usr/lib/python3.11", "/venv/site-packages"]
    assert new == [cwd, deps]


def test_a_user_site_that_exists_goes_before_site_packages(tmp_path, user_base) -> None:
    user_site = site.getusersitepackages()
    os.makedirs(user_site)
    path, new = job_sys_path(str(tmp_path), "", BASE, dropped={"/prestart-home"})
    assert path[-2:] == [user_site, "/venv/site-packages"] and user_site in new


def test_the_catalog_takes_a_kernels_mode_and_refuses_others() -> None:
    catalog = load_catalog("pools:\n  - name: nb\n    kernels: prestart\n  - name: rl\n")
    assert catalog.pools["nb"].kernels == "prestart" and catalog.pools["rl"].kernels == "auto"
    with pytest.raises(CatalogError, match="kernels must be one of"):
        load_catalog("pools:\n  - name: nb\n    kernels: warm\n")


def test_the_watch_hook_notes_what_is_opened_or_listed_under_the_session_dirs_until_stopped(tmp_path) -> None:
    from firepool_agent.kernel_bind import Touches

    session, elsewhere = tmp_path / "workspace", tmp_path / "private"
    session.mkdir()
    elsewhere.mkdir()
    (session / "notes.txt").write_text("old session")
    (elsewhere / "own.txt").write_text("ours")
    touches = Touches([str(session)])
    (elsewhere / "own.txt").read_text()
    os.listdir(elsewhere)
    assert touches.found == []
    (session / "notes.txt").read_text()
    os.listdir(session)
    assert sorted(set(touches.found)) == [str(session), str(session / "notes.txt")]
    touches.stop()
    (session / "notes.txt").read_text()  # after the bind the job's own opens are not recorded
    assert len(touches.found) == 2

