"""Late binding end to end on a real broker: packages, incremental dependencies, kept and wiped paths.

Wheels are written locally into a directory the pool binds read-only at /wheels; every install
points there with --no-index, so nothing touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.wheels import write_wheel
from broker.client import Client
from tests.integration.conftest import run_job

pytestmark = pytest.mark.integration


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    directory = tmp_path / "wheels"
    directory.mkdir()
    for name in ("alpha", "beta", "gamma"):
        for version in ("1.0", "2.0"):
            write_wheel(directory, name, version)
    directory.chmod(0o755)
    tmp_path.chmod(0o755)  # the sandbox uid reads the wheels through the bind
    return directory


def pools_yaml(wheels: Path) -> str:
    return (
        "pools:\n"
        "  - name: cpu\n    max_count: 4\n    max_idle_count: 4\n    caller_hold_seconds: 60\n"
        "    keep_paths: [/cache/uv]\n    wipe_paths: [/scratch]\n"
        f"    template: {{binds: [{{src: {wheels}, dst: /wheels, ro: true}}]}}\n"
    )


def requirements(*pins: str) -> str:
    return "\n".join(["--no-index", "--find-links /wheels", *pins]) + "\n"


SHOW = ("import alpha, beta, gamma, os; "
        "print('versions', alpha.VERSION, beta.VERSION, gamma.VERSION); "
        "print('ctimes', os.stat(alpha.__file__).st_ctime_ns, os.stat(gamma.__file__).st_ctime_ns)")


def zbytes(files: dict[str, str], modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            if modes and name in modes:
                info.create_system = 3
                info.external_attr = modes[name] << 16
            z.writestr(info, data)
    return buf.getvalue()


def stored(state_dir: Path) -> list[Path]:
    return [p for p in (state_dir / "packages").rglob("*") if p.is_file()]


def test_refused_archives_leave_nothing_stored_and_a_job_runs_code_from_its_package(broker_factory, tmp_path):
    b = broker_factory(extra=("--package-max-bytes", "200000", "--package-max-extracted", "5000000"))
    c = b.client("alice")
    evil = {
        "dotdot": (zbytes({"../escape.py": "x"}), 400),
        "absolute": (zbytes({"/abs.py": "x"}), 400),
        "symlink": (zbytes({"link": "/etc/passwd"}, {"link": stat.S_IFLNK | 0o777}), 400),
        "zip bomb": (zbytes({"bomb": "\0" * 6_000_000}), 413),
        "oversized": (zbytes({"noise": base64.b64encode(os.urandom(300_000)).decode()}), 413),
    }
    for name, (data, status) in evil.items():
        r = c.put(f"/v1/packages/{hashlib.sha256(data).hexdigest()}", content=data,
                  headers={"content-type": "application/zip"})
        assert r.status_code == status, (name, r.text)
        assert r.json()["error"]["class"] in ("UnsafePackage", "PayloadTooLarge"), name
    good = zbytes({"main.py": "print('x')"})
    r = c.put(f"/v1/packages/{'f' * 64}", content=good, headers={"content-type": "application/zip"})
    assert r.status_code == 400 and r.json()["error"]["class"] == "DigestMismatch"
    assert stored(b.state_dir) == []

    tree = tmp_path / "project"
    (tree / "lib").mkdir(parents=True)
    (tree / "main.py").write_text("from lib.answer import ANSWER\nprint('from-package', ANSWER)\n")
    (tree / "lib" / "answer.py").write_text("ANSWER = 6 * 7\n")
    (tree / "secret.env").write_text("TOKEN=1\n")
    (tree / ".gitignore").write_text("*.env\n")
    with Client(url=b.url, token=b.tokens["alice"]) as fp:
        digest = fp.package(tree)
        assert fp.package(tree) == digest  # HEAD found it: same digest, no second copy
        assert len([p for p in stored(b.state_dir) if p.suffix == ".zip"]) == 1
        job = fp.run(["python3", "main.py"], lease_tag="pkg", package=digest)
        assert job.state == "SUCCEEDED", job.raw
        assert "from-package 42" in fp.logs(job.id)
        timings = job.attempts[-1]["timings"]
        assert timings["package_unpack_s"] > 0 and timings["package_push_s"] > 0
        print(f"\npackage push {timings['package_push_s'] * 1000:.1f} ms, "
              f"unpack {timings['package_unpack_s'] * 1000:.1f} ms")
        leaked = fp.run(["python3", "-c", "import os; print(sorted(os.listdir('/pkg')), os.path.exists('secret.env'))"],
                        lease_tag="pkg")
        assert "[] False" in fp.logs(leaked.id)  # reset emptied the package dir; the excluded file never came


def test_submit_with_package_runs_the_directory_from_the_cli(broker, tmp_path):
    tree = tmp_path / "cli-project"
    tree.mkdir()
    (tree / "hello.py").write_text("import sys; print('hello from', sys.argv[1])\n")
    out = subprocess.run([sys.executable, "-m", "broker.cli", "submit", "--package", str(tree), "--wait", "--",
                          "python3", "hello.py", "cli"], env=broker.env("bob"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "hello from cli" in out.stdout


def _deps_job(c, pins: str, command: str = SHOW) -> dict:
    return run_job(c, {"command": ["python3", "-c", command], "lease_tag": "deps", "requirements": pins,
                       "env": {"UV_CACHE_DIR": "/cache/uv"}}, wait=180)


def test_requirements_install_once_then_hit_the_marker_then_install_one_changed_pin(broker_factory, wheels):
    b = broker_factory(pools=pools_yaml(wheels))
    c = b.client("alice")
    first = _deps_job(c, requirements("alpha==1.0", "beta==1.0", "gamma==1.0"))
    assert first["state"] == "SUCCEEDED", first
    log1 = c.get(f"/v1/jobs/{first['id']}/logs").text
    assert "versions 1.0 1.0 1.0" in log1
    t1 = first["attempts"][-1]["timings"]
    assert t1["deps_marker_hit"] == 0

    same = _deps_job(c, requirements("alpha==1.0", "beta==1.0", "gamma==1.0"))
    assert same["state"] == "SUCCEEDED" and same["bound_pods"] == first["bound_pods"]
    t2 = same["attempts"][-1]["timings"]
    assert t2["deps_marker_hit"] == 1 and t2["deps_install_s"] < t1["deps_install_s"]

    changed = _deps_job(c, requirements("alpha==1.0", "beta==2.0", "gamma==1.0"))
    assert changed["state"] == "SUCCEEDED" and changed["bound_pods"] == first["bound_pods"]
    log3 = c.get(f"/v1/jobs/{changed['id']}/logs").text
    assert "versions 1.0 2.0 1.0" in log3
    # Incremental: the unchanged pins' files were not rewritten, only beta changed.
    assert log1.split("ctimes ")[1].split()[:2] == log3.split("ctimes ")[1].split()[:2]
    t3 = changed["attempts"][-1]["timings"]
    assert t3["deps_marker_hit"] == 0
    print(f"\nfirst install (3 pins) {t1['deps_install_s'] * 1000:.0f} ms; same pins {t2['deps_install_s'] * 1000:.1f} ms "
          f"(marker hit); one changed pin {t3['deps_install_s'] * 1000:.0f} ms")


def test_a_failed_install_is_a_dependency_error_and_leaves_no_marker(broker_factory, wheels):
    b = broker_factory(pools=pools_yaml(wheels))
    c = b.client("alice")
    good = requirements("alpha==1.0", "beta==1.0", "gamma==1.0")
    assert _deps_job(c, good)["state"] == "SUCCEEDED"
    failed = _deps_job(c, requirements("alpha==1.0", "beta==9.9"), "print('never runs')")
    assert failed["state"] == "FAILED" and failed["error_class"] == "DependencyError", failed
    assert "beta" in failed["error_message"] and "exited" in failed["error_message"]
    assert "exit_code" not in failed  # no process of the job ran
    print(f"\nfailed install {failed['attempts'][-1]['timings']['deps_install_s'] * 1000:.0f} ms: "
          f"{failed['error_message'].splitlines()[-1]}")
    again = _deps_job(c, good)
    assert again["state"] == "SUCCEEDED" and again["bound_pods"] == failed["bound_pods"]
    assert again["attempts"][-1]["timings"]["deps_marker_hit"] == 0  # every marker went before the failed install


def test_kept_paths_outlive_resets_and_pods_per_caller_while_wiped_paths_are_emptied(broker_factory, wheels):
    b = broker_factory(pools=pools_yaml(wheels))
    alice, bob = b.client("alice"), b.client("bob")
    write = ("import pathlib; pathlib.Path('/cache/uv/note').write_text('kept'); "
             "pathlib.Path('/scratch/tmp').write_text('wiped')")
    first = run_job(alice, {"command": ["python3", "-c", write], "lease_tag": "k"})
    assert first["state"] == "SUCCEEDED", first
    read = ("import os, pathlib; note = pathlib.Path('/cache/uv/note'); "
            "print('kept', note.read_text() if note.exists() else None, 'scratch', sorted(os.listdir('/scratch')))")
    again = run_job(alice, {"command": ["python3", "-c", read], "lease_tag": "k"})
    assert again["bound_pods"] == first["bound_pods"]
    assert "kept kept scratch []" in alice.get(f"/v1/jobs/{again['id']}/logs").text
    other = run_job(bob, {"command": ["python3", "-c", read]})
    assert other["bound_pods"] != first["bound_pods"]  # another caller's pod: its own, empty cache
    assert "kept None scratch []" in bob.get(f"/v1/jobs/{other['id']}/logs").text
    later = run_job(alice, {"command": ["python3", "-c", read], "single_use": True})
    assert later["bound_pods"] != first["bound_pods"]  # alice's cache follows her to a new pod
    assert "kept kept scratch []" in alice.get(f"/v1/jobs/{later['id']}/logs").text
