"""The output filter in front of SGLang when an API key is set: the key never reaches the journal, and
the exit status (a death by SIGKILL included) reaches systemd unchanged."""

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FILTER = Path(__file__).resolve().parents[2] / "roles" / "sglang_service" / "files" / "sglang-redact"


def run(tmp_path, script: str) -> subprocess.CompletedProcess:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text('# managed\napi-key: "sk-\\"live\\"-42"\n')
    return subprocess.run([sys.executable, str(FILTER), str(secrets), "--", "sh", "-c", script],
                          capture_output=True, timeout=30)


def test_key_is_redacted_from_stdout_and_stderr(tmp_path):
    out = run(tmp_path, """echo "server_args=ServerArgs(api_key='sk-\\"live\\"-42')"; echo 'sk-"live"-42' >&2""")
    assert b"sk-" not in out.stdout
    assert out.stdout.count(b"[REDACTED]") == 2
    assert out.returncode == 0


def test_exit_status_passes_through(tmp_path):
    assert run(tmp_path, "exit 3").returncode == 3


def test_death_by_sigkill_passes_through(tmp_path):
    assert run(tmp_path, "kill -9 $$").returncode == -signal.SIGKILL


# Keys that repr() and json.dumps() write differently from their raw text: a backslash, both quote characters,
# a control character, non-ASCII. SGLang logs server_args with repr() (a dataclass) and some paths as JSON.
AWKWARD_KEYS = ["sk-back\\slash-1", "sk-it's-2", 'sk-both\'and"-3', "sk-tab\there-4", "sk-ünï-5", "sk-\\'mix\"-6"]


def run_key(tmp_path, key: str, lines: list[str]) -> bytes:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(f"# managed\napi-key: {json.dumps(key)}\n")
    script = tmp_path / "emit.py"
    script.write_text("import sys\nfor line in sys.argv[1:]:\n    print(line)\n")
    out = subprocess.run([sys.executable, str(FILTER), str(secrets), "--", sys.executable, str(script), *lines],
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_key_is_redacted_in_every_form_sglang_writes_it(tmp_path):
    @dataclass
    class ServerArgs:
        model_path: str
        api_key: str

    for key in AWKWARD_KEYS:
        lines = [key, f"server_args={ServerArgs('/m', key)!r}", repr({"api_key": key}), json.dumps({"api_key": key}),
                 json.dumps({"api_key": key}, ensure_ascii=False)]
        out = run_key(tmp_path, key, lines)
        assert out.count(b"[REDACTED]") == len(lines), (key, out)
        for form in {key, repr(key)[1:-1], json.dumps(key)[1:-1]}:
            assert form.encode() not in out, (key, form, out)
        # the tail that stays once the key is gone: nothing of it is left behind
        assert b"sk-" not in out, (key, out)


def test_other_text_is_left_alone(tmp_path):
    out = run_key(tmp_path, "sk-it's-2", ["it's fine", "sk-other"])
    assert out == b"it's fine\nsk-other\n"
