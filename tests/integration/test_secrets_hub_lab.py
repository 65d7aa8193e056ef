"""The sglang_model role's Hugging Face path on a lab host, with the real `hf` CLI (installed with SGLang's venv
from the lab index) against the Hub stand-in the lab's mirror serves (sim/hub): a missing token and a wrong
revision are refused before any download, naming what to fix; with the token the gated model downloads. A
sentinel token and a sentinel API key then appear nowhere: not in the -vvv --diff output of the run, nor in
`ps` sampled on the host and the controller during it, the journal, the unit, the local facts (the host's
and the controller's fact cache), the rollout report, or any file on the host others can read.

Runs on itest-2 only (the lab_inventory fixture's second host), after the rollout tests of this directory if
they run in the same session (it leaves itest-2 serving tp8, as they do). About a minute on a warm host.

Cost (a fresh-clone make test, beside two other jobs): the download with the token 93 s (its fixture), each refusal
about 20 s, the checks on what it left under 1 s.

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 108 s wall, 38 + 46 CPU-s (the download with the token and its
fixture 78 s, 28 + 34).
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sim" / "hub"))
sys.path.insert(0, str(ROOT / "tests"))
import hub  # noqa: E402  (the stand-in's constants: its token, the test model)
from playbook import on_host, run_playbook  # noqa: E402  (tests/playbook.py)

HOST = "itest-2"
TOKEN = hub.LAB_HF_TOKEN  # the one token the stand-in accepts; a sentinel nothing may show
API_KEY = f"sk-moefleet-sentinel-{secrets.token_hex(8)}"
MODEL = {
    "sglang_model_source": "huggingface",
    "sglang_model_repo": hub.GATED_REPO,
    "sglang_model_download_poll": 1,
    # a DeepSeek-V3 architecture: served with that model's parsers (docs/models.md), the correctness gate's
    # requests sent with the API key
    "sglang_service_model": "deepseek-v3",
}
PLAYBOOK = """---
- name: The model role alone, on the host under test
  hosts: blackwell
  gather_facts: false
  roles:
    - role: sglang_model
"""


def extra_vars(tmp_path: Path, name: str, values: dict) -> Path:
    """Variables (secrets among them) go to ansible-playbook as -e @file, never on its command line."""
    path = tmp_path / f"{name}.yml"
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(values))
    return path


def playbook(inventory: Path, tmp_path: Path, book: Path, values: dict, *args: str) -> subprocess.CompletedProcess:
    result = run_playbook(inventory, book, f"@{extra_vars(tmp_path, book.stem, values)}",
                          options=("--limit", f"{HOST},localhost", *args))
    print(result.stdout[-6000:], result.stderr[-3000:])  # shown when a test fails
    return result


@pytest.fixture(scope="module")
def revision(lab_inventory) -> str:
    built = hub.LAB / "mirror" / "hub" / "revisions.json"
    assert built.is_file(), "the lab's mirror has no Hub content: lab.py up builds it"
    return json.loads(built.read_text())[hub.GATED_REPO][-1]


@pytest.fixture(scope="module")
def model_book(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("books") / "model.yml"
    path.write_text(PLAYBOOK)
    return path


def test_missing_token_is_refused_before_any_download(lab_inventory, tmp_path, model_book, revision):
    target = "/srv/models/tiny-moe-notoken"
    result = playbook(lab_inventory, tmp_path, model_book,
                      MODEL | {"sglang_model_revision": revision, "sglang_model_path": target})
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{hub.GATED_REPO} needs a Hugging Face token" in out and "set sglang_model_hf_token" in out
    assert "Run hf download" not in out  # refused by the preflight, before the download task
    assert on_host(lab_inventory, HOST, f"test -e {target} && echo present || echo absent").strip() == "absent"


def test_wrong_revision_is_refused_with_the_variable(lab_inventory, tmp_path, model_book):
    target = "/srv/models/tiny-moe-badrev"
    wrong = "0123456789abcdef0123456789abcdef01234567"
    result = playbook(lab_inventory, tmp_path, model_book,
                      MODEL | {"sglang_model_revision": wrong, "sglang_model_path": target,
                               "sglang_model_hf_token": TOKEN})
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{hub.GATED_REPO} has no revision {wrong}" in out and "set sglang_model_revision" in out
    assert "Run hf download" not in out
    assert on_host(lab_inventory, HOST, f"test -e {target} && echo present || echo absent").strip() == "absent"
    assert TOKEN not in out


class PsSampler:
    """`ps` with every process's arguments and environment, sampled on the host (a loop there, every 0.1 s)
    and on the controller, for as long as the run lasts."""

    def __init__(self, inventory: Path):
        self.inventory, self.local, self.stop = inventory, [], threading.Event()
        on_host(inventory, HOST, "rm -f /root/ps-samples /root/ps-stop; nohup sh -c 'while [ ! -e /root/ps-stop ]; do "
                           "ps -e -ww -o pid=,user=,args=; ps -e -ww e -o args=; sleep 0.1; done' "
                           ">/root/ps-samples 2>&1 </dev/null &")
        self.thread = threading.Thread(target=self._local, daemon=True)
        self.thread.start()

    def _local(self) -> None:
        while not self.stop.wait(0.2):
            self.local.append(subprocess.run(["ps", "-e", "-ww", "e", "-o", "args="], text=True,
                                             capture_output=True).stdout)

    def finish(self) -> tuple[str, str]:
        self.stop.set()
        self.thread.join()
        host = on_host(self.inventory, HOST,
                       "touch /root/ps-stop; sleep 0.3; cat /root/ps-samples; rm -f /root/ps-samples")
        return host, "".join(self.local)


@pytest.fixture(scope="module")
def download(lab_inventory, tmp_path_factory, revision):
    """A rollout of tp8 to the host with the gated model from the Hub and an API key, at -vvv with --diff."""
    tmp = tmp_path_factory.mktemp("download")
    reports = tmp / "reports"  # the report's own directory: the extra-vars file beside it holds the secrets
    values = MODEL | {"sglang_model_revision": revision, "sglang_model_path": "/srv/models/tiny-moe",
                      "sglang_model_hf_token": TOKEN, "sglang_model_gated": True, "sglang_service_api_key": API_KEY,
                      "profile": "tp8", "confirm": "yes", "moefleet_report_path": str(reports / "rollout")}
    reports.mkdir()
    on_host(lab_inventory, HOST, "rm -rf /srv/models/tiny-moe")
    sampler = PsSampler(lab_inventory)
    result = playbook(lab_inventory, tmp, ROOT / "playbooks" / "rollout.yml", values, "-vvv", "--diff")
    ps_host, ps_local = sampler.finish()
    return {"result": result, "ps_host": ps_host, "ps_local": ps_local, "reports": reports}


def test_download_succeeds_with_the_token(lab_inventory, download, revision):
    assert download["result"].returncode == 0, download["result"].stdout[-3000:]
    listing = on_host(lab_inventory, HOST, "cd /srv/models/tiny-moe && stat -c '%U %s %n' *.json *.safetensors "
                                     "&& cat .cache/huggingface/download/config.json.metadata")
    files = hub.model_files(2)
    for name, content in files.items():
        assert f"sglang {len(content)} {name}" in listing, listing
    assert revision in listing  # hf recorded the commit it fetched
    # the key really reached SGLang: without it the server refuses, with it it answers
    probe = "curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:30000/v1/models"
    answers = on_host(lab_inventory, HOST, f"{probe}; {probe} -H 'Authorization: Bearer {API_KEY}'")
    assert answers.split() == ["401", "200"]


def test_ps_sampling_saw_the_download(download):
    # the sampler ran while hf downloaded (else the checks below prove nothing)
    assert f"download {hub.GATED_REPO}" in download["ps_host"]
    assert "HF_TOKEN_PATH=" in download["ps_host"]  # the environment was sampled too: a path, never the token


@pytest.mark.parametrize("secret", ["token", "api_key"])
def test_sentinels_appear_nowhere(lab_inventory, download, secret):
    value = {"token": TOKEN, "api_key": API_KEY}[secret]
    result = download["result"]
    assert "ESTABLISH SSH CONNECTION" in result.stdout  # it really ran at -vvv
    assert "+++ after" in result.stdout  # and printed diffs
    places = {
        "-vvv --diff output": result.stdout + result.stderr,
        "ps on the host": download["ps_host"],
        "ps on the controller": download["ps_local"],
        "journal": on_host(lab_inventory, HOST, "journalctl --no-pager -o verbose"),
        "unit": on_host(lab_inventory, HOST, "systemctl cat sglang.service; cat /etc/systemd/system/sglang*"),
        "local facts": on_host(lab_inventory, HOST, "cat /etc/ansible/facts.d/*"),
        "controller fact cache": "".join(p.read_text(errors="replace")
                                         for p in (ROOT / ".ansible" / "facts").glob(f"{HOST}*")),
        "reports": "".join(p.read_text() for p in download["reports"].glob("rollout*")),
    }
    assert places["reports"], "the rollout wrote no report"
    leaked = [where for where, text in places.items() if value in text]
    assert leaked == [], f"the sentinel {secret} appears in: {', '.join(leaked)}"


@pytest.mark.parametrize("secret", ["token", "api_key"])
def test_no_file_others_can_read_holds_a_sentinel(lab_inventory, download, secret):
    value = {"token": TOKEN, "api_key": API_KEY}[secret]
    found = on_host(lab_inventory, HOST, f"grep -rlsF -e '{value}' / --exclude-dir=proc --exclude-dir=sys "
                                   "--exclude-dir=Kimi-K2.6 | xargs -r stat -c '%a %U:%G %n'")
    for line in found.splitlines():
        mode, owner, path = line.split(" ", 2)
        # the service's own credential (LoadCredential=) and its root-only source may hold the key
        assert int(mode, 8) & 0o004 == 0 and owner.split(":")[0] in ("root", "sglang"), line
        assert int(mode, 8) & 0o040 == 0 or owner.split(":")[1] in ("root", "sglang"), line
