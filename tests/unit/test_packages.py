"""Code packages: real archives refused or stored once, the deterministic builder, and delivery at launch."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from pathlib import Path

import httpx
import pytest

from broker.api.app import create_app
from broker.api.auth import TokenAuth
from broker.errors import DigestMismatch, PayloadTooLarge, UnsafePackage
from broker.jobs import JobState
from broker.packaging import build, files_of
from broker.running.packages import FilePackageStore, PackageLimits
from tests.unit.harness import Harness, cpu_pool

ALICE, BOB = "alice-token", "bob-token"
SMALL = PackageLimits(max_compressed=64 << 10, max_extracted=256 << 10, max_entries=50)


def zbytes(files: dict[str, bytes | str], *, modes: dict[str, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if modes and name in modes:
                info.create_system = 3
                info.external_attr = modes[name] << 16
            z.writestr(info, data)
    return buf.getvalue()


def lying_bomb(real: int) -> bytes:
    """A deflated entry whose headers claim 10 bytes but which inflates to `real` bytes."""
    data = zbytes({"bomb.bin": b"\0" * real})
    claimed = (10).to_bytes(4, "little")
    # The local header's and the central directory's uncompressed-size fields both lie.
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    out = bytearray(data)
    out[local + 22:local + 26] = claimed
    out[central + 24:central + 28] = claimed
    return bytes(out)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stored_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.fixture
def store(tmp_path: Path) -> FilePackageStore:
    return FilePackageStore(tmp_path / "packages", SMALL)


@pytest.fixture
async def api(store: FilePackageStore):
    h = await Harness([cpu_pool()], packages=store).start()
    app = create_app(h.cp, TokenAuth({ALICE: "alice", BOB: "bob"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fp") as http:
        http.h = h  # type: ignore[attr-defined]
        yield http
    await h.stop()


def put(api: httpx.AsyncClient, data: bytes, name: str | None = None, token: str = ALICE):
    return api.put(f"/v1/packages/{name or digest(data)}", content=data,
                   headers={"Authorization": f"Bearer {token}", "Content-Type": "application/zip"})


BAD_ARCHIVES = {
    "parent escape": (zbytes({"ok.py": "1", "../escape.txt": "x"}), 400, "UnsafePackage"),
    "nested parent escape": (zbytes({"a/../../escape.txt": "x"}), 400, "UnsafePackage"),
    "absolute path": (zbytes({"/etc/cron.d/evil": "x"}), 400, "UnsafePackage"),
    "symlink": (zbytes({"link": "/etc/passwd"}, modes={"link": stat.S_IFLNK | 0o777}), 400, "UnsafePackage"),
    "fifo": (zbytes({"pipe": ""}, modes={"pipe": stat.S_IFIFO | 0o644}), 400, "UnsafePackage"),
    "zip bomb": (zbytes({"bomb.bin": b"\0" * (1 << 20)}), 413, "PayloadTooLarge"),
    "zip bomb with lying headers": (lying_bomb(1 << 20), 400, "PackageError"),
    "many small entries adding up": (zbytes({f"f{i}": b"\0" * (40 << 10) for i in range(8)}), 413,
                                     "PayloadTooLarge"),
    "too many entries": (zbytes({f"f{i}": "" for i in range(60)}), 413, "PayloadTooLarge"),
    "oversized archive": (zbytes({"noise.bin": os.urandom(80 << 10)}), 413, "PayloadTooLarge"),
    "not a zip": (b"just some bytes, no archive", 400, "PackageError"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARCHIVES))
async def test_unsafe_or_oversized_archive_is_refused_with_a_typed_4xx_and_nothing_stored(
        api, store: FilePackageStore, case: str) -> None:
    data, status, cls = BAD_ARCHIVES[case]
    r = await put(api, data)
    assert r.status_code == status, r.text
    assert r.json()["error"]["class"] == cls
    assert stored_files(store.root) == []
    head = await api.head(f"/v1/packages/{digest(data)}", headers={"Authorization": f"Bearer {ALICE}"})
    assert head.status_code == 404


async def test_digest_mismatch_is_refused_and_nothing_stored(api, store: FilePackageStore) -> None:
    data = zbytes({"main.py": "print(1)"})
    r = await put(api, data, name="0" * 64)
    assert r.status_code == 400 and r.json()["error"]["class"] == "DigestMismatch"
    assert stored_files(store.root) == []


async def test_a_name_that_is_not_a_sha256_is_invalid(api) -> None:
    r = await put(api, zbytes({"a": "b"}), name="ABC")
    assert r.status_code == 422 and r.json()["error"]["class"] == "InvalidRequest"


async def test_identical_uploads_are_stored_once_and_seen_only_by_their_uploaders(api, store) -> None:
    data = zbytes({"main.py": "print('x')", "lib/util.py": "X = 1"})
    first, again = await put(api, data), await put(api, data)
    assert (first.status_code, first.json()["created"]) == (201, True)
    assert (again.status_code, again.json()["created"]) == (200, False)
    assert [p.name for p in store.root.rglob("*.zip") if "incoming" not in p.parts] == [f"{digest(data)}.zip"]
    bob = {"Authorization": f"Bearer {BOB}"}
    assert (await api.head(f"/v1/packages/{digest(data)}", headers=bob)).status_code == 404
    assert (await api.get(f"/v1/packages/{digest(data)}", headers=bob)).status_code == 404
    assert (await put(api, data, token=BOB)).status_code == 201  # bob's first upload; still no second copy
    got = await api.get(f"/v1/packages/{digest(data)}", headers=bob)
    assert got.status_code == 200 and got.content == data
    assert len(list(store.root.rglob("*.zip"))) == 1


async def test_uploading_bytes_another_caller_stored_answers_as_a_first_upload(api, store) -> None:
    # The oracle: `created: false` told bob that someone had already stored exactly these bytes.
    data = zbytes({"secret_config.py": "TOKEN = 'guessable'"})
    alone = await put(api, zbytes({"other.py": "1"}), token=BOB)
    assert (await put(api, data)).status_code == 201
    bobs = await put(api, data, token=BOB)
    assert (bobs.status_code, bobs.json()["created"]) == (alone.status_code, alone.json()["created"]) == (201, True)
    assert set(bobs.json()) == set(alone.json()) == {"digest", "size", "created"}
    again = await put(api, data, token=BOB)
    assert (again.status_code, again.json()["created"]) == (200, False)  # his own second upload: he knows it
    assert len([p for p in store.root.rglob("*.zip") if "incoming" not in p.parts]) == 2  # stored once each


BAD_NAMES = ["", "ABC", "a" * 63, "a" * 65, "g" * 64, "A" * 64, "a" * 64 + "/", "a" * 32 + "/" + "a" * 31, "x y"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("content_type", ["application/zip", "text/plain"])
async def test_a_package_path_that_is_not_64_lower_case_hex_digits_is_a_typed_422(api, name: str,
                                                                                  content_type: str) -> None:
    headers = {"Authorization": f"Bearer {ALICE}", "Content-Type": content_type}
    path = "/v1/packages" if not name else f"/v1/packages/{name}"
    for method in ("PUT", "GET", "HEAD"):
        r = await api.request(method, path, content=b"PK\x05\x06" if method == "PUT" else None, headers=headers)
        assert r.status_code == 422, (method, path, r.status_code, r.text)
        if method != "HEAD":
            assert r.json()["error"]["class"] == "InvalidRequest" and r.json()["error"]["details"] == {"field": "digest"}


def test_the_store_refuses_directly_with_typed_errors(store: FilePackageStore) -> None:
    with pytest.raises(DigestMismatch):
        store.put("alice", "1" * 64, [zbytes({"a": "b"})])
    with pytest.raises(UnsafePackage):
        data = zbytes({"../x": "b"})
        store.put("alice", digest(data), [data])
    with pytest.raises(PayloadTooLarge):
        data = zbytes({"many": b"\0" * (1 << 20)})
        store.put("alice", digest(data), [data])
    assert stored_files(store.root) == []


async def test_a_job_naming_a_package_its_caller_never_uploaded_is_refused(api) -> None:
    r = await api.post("/v1/jobs", json={"command": ["python3", "main.py"], "package": "a" * 64},
                       headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 400 and r.json()["error"]["class"] == "PackageError"


async def test_a_packaged_job_gets_its_package_pushed_before_launch(api) -> None:
    data = zbytes({"main.py": "print(42)"})
    assert (await put(api, data)).status_code == 201
    r = await api.post("/v1/jobs", json={"command": ["echo", "hi"], "package": digest(data)},
                       headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 201, r.text
    h: Harness = api.h  # type: ignore[attr-defined]
    job = await h.finish(h.store.get(r.json()["id"]))  # type: ignore[arg-type]
    assert job.state is JobState.SUCCEEDED
    launch = next(req for a in h.backend.agents.values() for req in a.launches)
    assert launch.extra["package"] == digest(data)
    assert "package_push_s" in job.attempts[-1].timings
    view = (await api.get(f"/v1/jobs/{job.id}", headers={"Authorization": f"Bearer {ALICE}"})).json()
    assert view["package"] == digest(data) and "package_push_s" in view["attempts"][-1]["timings"]


async def test_a_failed_push_fails_the_launch_with_package_error_and_runs_nothing(store) -> None:
    h = await Harness([cpu_pool(min_count=2)], packages=store).start()
    try:
        await h.run_for(1.0)
        for agent in h.backend.agents.values():
            agent.fail_push = True
        data = zbytes({"main.py": "print(42)"})
        store.put("alice", digest(data), [data])
        job = await h.run_job(command=("echo", "x"), extra={"package": digest(data)})
        assert job.state is JobState.FAILED and job.error_class == "PackageError"
        assert "could not be delivered" in (job.error_message or "")
        assert all(not a.launches for a in h.backend.agents.values())
    finally:
        await h.stop()


async def test_the_sdk_uploads_a_tree_once_and_names_it_by_digest(api, store, tmp_path: Path) -> None:
    from broker.client import AsyncClient

    tree = tmp_path / "sdk-tree"
    tree.mkdir()
    (tree / "main.py").write_text("print('sdk')\n")
    h: Harness = api.h  # type: ignore[attr-defined]
    app = create_app(h.cp, TokenAuth({ALICE: "alice"}))
    seen: list[str] = []

    async def count(request: httpx.Request) -> None:
        seen.append(request.method)

    transport = httpx.ASGITransport(app=app)
    async with AsyncClient(url="http://fp", token=ALICE, transport=transport) as fp:
        fp._http.event_hooks["request"].append(count)
        first = await fp.package(tree)
        again = await fp.package(tree)
    assert first == again == build(tree)[1]
    assert seen == ["HEAD", "PUT", "HEAD"]  # the second call found it and uploaded nothing
    assert store.exists("alice", first)


def test_the_same_tree_gives_the_same_bytes_and_digest(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "main.py").write_text("print(1)\n")
    (tree / "pkg" / "mod.py").write_text("X = 2\n")
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    first = build(tree)
    os.utime(tree / "main.py", (1, 1))  # timestamps and listing order must not matter
    (tree / "main.py").chmod(0o600)
    second = build(tree)
    assert first == second
    with zipfile.ZipFile(io.BytesIO(first[0])) as z:
        assert z.namelist() == ["main.py", "pkg/mod.py", "run.sh"]
        assert (z.getinfo("run.sh").external_attr >> 16) & 0o777 == 0o755
        assert (z.getinfo("main.py").external_attr >> 16) & 0o777 == 0o644
    (tree / "main.py").write_text("print(2)\n")
    assert build(tree)[1] != first[1]


def test_gitignore_style_excludes_leave_paths_out(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for rel in ("main.py", "data/big.bin", "src/a.py", "src/a.pyc", "src/deep/b.pyc", "build/out.o",
                "logs/keep.log", "logs/x.log", ".git/HEAD", "notes/build/x.txt"):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(rel)
    (tree / ".gitignore").write_text("# compiled\n*.pyc\n/build/\nlogs/*.log\n!logs/keep.log\n")
    names = [rel for rel, _, _ in files_of(tree, ["data/"])]
    assert names == [".gitignore", "logs/keep.log", "main.py", "notes/build/x.txt", "src/a.py"]


def test_a_symlink_in_the_tree_is_refused_before_upload(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "main.py").write_text("1")
    (tree / "secret").symlink_to("/etc/passwd")
    with pytest.raises(UnsafePackage):
        build(tree)
