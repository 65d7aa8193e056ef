"""The Hub stand-in (sim/hub) against the real hf client (huggingface_hub 1.33.0 from the lab's wheelhouse):
each behaviour the Hub has, and the failures it answers with, seen through `hf download`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sim" / "hub"))
import hub  # noqa: E402

CLIENT = ROOT / ".lab" / "hf-client"


@pytest.fixture(scope="module")
def hf() -> Path:
    if not (CLIENT / "bin" / "hf").exists():
        wheels = hub.client_wheels()
        subprocess.run([sys.executable, "-m", "venv", str(CLIENT)], check=True)
        subprocess.run([CLIENT / "bin" / "pip", "install", "-q", "--no-index", "--find-links", wheels[0].parent,
                        hub.HF_CLIENT_SPEC], check=True)
    return CLIENT / "bin" / "hf"


def serve(root: Path, *args: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (root / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, ROOT / "sim" / "hub" / "server.py", root / "hub", "--port", str(port),
                             "--bind", "127.0.0.1", *args], stderr=log)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    raise AssertionError("the stand-in did not start")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    return root, hub.build_hub(root / "hub")


def download(hf: Path, url: str, dest: Path, revision: str, token: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_ENDPOINT=url, HF_HUB_DISABLE_PROGRESS_BARS="1", NO_COLOR="1", HF_HOME=str(dest) + ".home")
    env.pop("HF_TOKEN", None)
    if token:
        (dest.parent / "token").write_text(hub.LAB_HF_TOKEN)
        env["HF_TOKEN_PATH"] = str(dest.parent / "token")
    return subprocess.run([hf, "download", hub.GATED_REPO, "--revision", revision, "--local-dir", dest],
                          env=env, capture_output=True, text=True, timeout=120)


def test_gated_wrong_revision_download_and_new_revision(hf, built, tmp_path):
    root, revisions = built
    old, new = revisions[hub.GATED_REPO]
    proc, url = serve(root, "--rate", "0")
    try:
        out = download(hf, url, tmp_path / "m", old, token=False)
        assert out.returncode != 0 and "requires approval" in out.stdout + out.stderr
        assert not (tmp_path / "m" / "config.json").exists()
        out = download(hf, url, tmp_path / "m", "0" * 40)
        assert out.returncode != 0 and "Revision not found" in out.stdout + out.stderr
        bad = tmp_path / "bad"
        bad.write_text("hf_NotAToken")
        env = dict(os.environ, HF_ENDPOINT=url, HF_TOKEN_PATH=str(bad), HF_HOME=str(tmp_path / "h"))
        out = subprocess.run([hf, "download", hub.GATED_REPO, "--revision", old, "--local-dir", tmp_path / "x"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "Invalid credentials" in out.stdout + out.stderr
        out = download(hf, url, tmp_path / "m", old)
        assert out.returncode == 0, out.stderr
        files = hub.model_files(1)
        for name, content in files.items():
            assert (tmp_path / "m" / name).read_bytes() == content
        meta = tmp_path / "m" / ".cache" / "huggingface" / "download" / "model-00001-of-00002.safetensors.metadata"
        assert meta.read_text().splitlines()[0] == old
        out = download(hf, url, tmp_path / "m", new)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "m" / "model-00002-of-00002.safetensors").read_bytes() == hub.model_files(2)[
            "model-00002-of-00002.safetensors"]
        assert json.loads((tmp_path / "m" / "config.json").read_text())["moefleet_lab_version"] == 2
    finally:
        proc.terminate()


def test_a_cut_download_resumes_with_range(hf, built, tmp_path):
    root, revisions = built
    proc, url = serve(root, "--rate", "0", "--cut-after", str(11 * 1024 * 1024))
    try:
        out = download(hf, url, tmp_path / "m", revisions[hub.GATED_REPO][0])
        assert out.returncode == 0, out.stderr
        assert "Trying to resume download" in out.stderr
    finally:
        proc.terminate()
    log = (root / "server.log").read_text()
    assert "/_cdn/" in log and "-> 206" in log
    for name, content in hub.model_files(1).items():
        assert (tmp_path / "m" / name).read_bytes() == content


def test_range_past_the_end_is_refused(built):
    import urllib.error
    import urllib.request

    root, revisions = built
    proc, url = serve(root)
    try:
        sha = json.loads((root / "hub" / "repos" / f"{hub.GATED_REPO}.json").read_text())[
            "commits"][revisions[hub.GATED_REPO][0]]["files"]["model-00001-of-00002.safetensors"]["sha256"]
        req = urllib.request.Request(f"{url}/_cdn/{sha}", headers={"Range": "bytes=999999999-"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req)
        assert err.value.code == 416
    finally:
        proc.terminate()


def test_the_tiny_model_is_one_the_planner_and_the_deploy_accept():
    # The deploy that downloads it (tests/integration/test_secrets_hub_lab.py) serves it: preflight plans tp8 on it.
    from ansible_collections.moefleet.serving.plugins.module_utils import planner

    plan = planner.plan(json.loads(hub.model_files(2)["config.json"]), 8, 94.97, {"tp_size": 8},
                        release="0.5.10").to_dict()
    assert plan["verdict"] == "fits", plan["reason"]
