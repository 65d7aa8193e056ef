"""The output filter in front of SGLang when an API key is set: the key never reaches the journal, and
the exit status (a death by SIGKILL included) reaches systemd unchanged."""

import signal
import subprocess
import sys
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
