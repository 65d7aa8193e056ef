"""The simulated SGLang server as a process: flags, start-up, serving, failure behaviour."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PARENT_DIES = "Received sigquit from a child process. It usually means the child failed."
NVIDIA_SMI = Path(__file__).resolve().parents[2] / "sim" / "gpu" / "nvidia-smi"
# TP8 at the fraction its profile sets: at SGLang's default for K2.6 (0.771) the KV pool has no room.
TP8 = ("--tp-size", "8", "--mem-fraction-static", "0.8")


def test_unknown_flag_fails_like_argparse(lab):
    srv = lab.start("--tp-size", "8", "--foo")
    assert srv.wait_exit() == 2
    assert "sglang serve: error: unrecognized arguments: --foo" in srv.log  # prepare_server_args's prog


def test_tp_not_divisible_by_ep_is_refused(lab):
    srv = lab.start("--tp-size", "8", "--ep-size", "3")
    assert srv.wait_exit() == 1
    assert "ValueError: tp_size 8 must be divisible by ep_size 3" in srv.log


def test_dp_attention_needs_tp_divisible_by_dp(lab):
    srv = lab.start("--tp-size", "8", "--dp-size", "3", "--enable-dp-attention")
    assert srv.wait_exit() == 1
    assert "AssertionError" in srv.log


def test_more_ranks_than_gpus_fails_in_set_device(lab):
    srv = lab.start("--tp-size", "16")
    assert srv.wait_exit() == -signal.SIGKILL
    assert "CUDA error: invalid device ordinal" in srv.log
    assert PARENT_DIES in srv.log


def test_tp4_ep2_ooms_while_loading_and_the_group_dies_by_sigkill(lab):
    srv = lab.start("--tp-size", "4", "--ep-size", "2")
    assert srv.wait_exit() == -signal.SIGKILL
    log = srv.log
    assert "Load weight begin. avail mem=" in log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert re.search(r"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB. GPU [0-3] has a "
                     r"total capacity of 94.97 GiB of which [0-9.]+ MiB is free. Including non-PyTorch memory, this "
                     r"process has [0-9.]+ GiB memory in use.", log)
    assert log.index("torch.OutOfMemoryError") < log.index(PARENT_DIES)
    assert "Uvicorn running" not in log
    time.sleep(0.3)
    assert lab.used_mib() == [0] * 8 and lab.apps() == []  # every rank died with the parent


@pytest.mark.parametrize("flags,prefix", [
    ((*TP8,), "TP7]"),
    (("--tp-size", "8", "--ep-size", "8", "--mem-fraction-static", "0.79"), "TP7 EP7]"),
    (("--tp-size", "8", "--ep-size", "4", "--mem-fraction-static", "0.79"), "TP7 EP3]"),
    (("--pp-size", "8", "--mem-fraction-static", "0.82"), "PP7]"),
])
def test_layouts_load_and_serve(lab, flags, prefix):
    srv = lab.start(*flags)
    srv.wait_ready()
    log = srv.log
    for text in ("Init torch distributed begin.", "Load weight end.", "KV Cache is allocated. #tokens: ",
                 "Capture cuda graph end.", "Uvicorn running on http://127.0.0.1:",
                 "The server is fired up and ready to roll!"):
        assert text in log
    assert prefix in log
    assert log.index("Load weight end.") < log.index("Uvicorn running")
    code, body = srv.get("/server_info")
    info = json.loads(body)
    assert code == 200 and info["max_total_num_tokens"] > 0
    assert [info["tp_size"], info["pp_size"], info["ep_size"]] == [int(x) for x in (
        dict(zip(flags[::2], flags[1::2], strict=True)).get("--tp-size", 1),
        dict(zip(flags[::2], flags[1::2], strict=True)).get("--pp-size", 1),
        dict(zip(flags[::2], flags[1::2], strict=True)).get("--ep-size", 1))]
    apps = lab.apps()
    assert len(apps) == 8 and all(a[1].startswith("sglang::scheduler") for a in apps)
    used = lab.used_mib()
    assert all(60_000 < u < 97_000 for u in used), used
    srv.stop()
    time.sleep(0.2)
    assert lab.used_mib() == [0] * 8


def test_port_listens_only_after_loading_then_503_until_ready(lab):
    srv = lab.start(*TP8, env={"SGLANG_SIM_TIME_SCALE": "0.4"})
    seen_refused = seen_503 = False
    end = time.time() + 30
    while time.time() < end:
        try:
            code, _ = srv.get("/health")
        except OSError:
            seen_refused = True
            time.sleep(0.005)
            continue
        if code == 503:
            seen_503 = True
        if code == 200:
            break
    assert seen_refused and seen_503


def test_openai_client_chat_completion(lab):
    openai = pytest.importorskip("openai")
    srv = lab.start(*TP8, "--ep-size", "4", "--served-model-name", "kimi-k2.6", "--api-key", "sk-lab",
                    "--enable-metrics")
    srv.wait_ready()
    client = openai.OpenAI(base_url=srv.url("/v1"), api_key="sk-lab")
    assert [m.id for m in client.models.list().data] == ["kimi-k2.6"]
    r = client.chat.completions.create(model="kimi-k2.6", messages=[{"role": "user", "content": "Hello"}],
                                       max_tokens=8)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 8
    assert r.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model="kimi-k2.6", messages=[{"role": "user", "content": "Hi"}],
                                                 stream=True, max_tokens=6))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")
    bad = openai.OpenAI(base_url=srv.url("/v1"), api_key="wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert srv.get("/health")[0] == 200  # health needs no key, like SGLang
    code, body = srv.get("/metrics")
    assert code == 200 and b"sglang:num_running_reqs" in body and b"sglang:generation_tokens_total" in body
    code, body = srv.get("/model_info", {"Authorization": "Bearer sk-lab"})
    assert json.loads(body)["model_type"] == "kimi_k25"


def test_loads_as_sglang_reports_them_and_get_load_is_deprecated(lab):
    """/v1/loads (entrypoints/v1_loads.py): per-rank entries and their aggregate, behind the API key;
    /get_load logs SGLang 0.5.10's deprecation warning at each call (http_server.get_load)."""
    srv = lab.start(*TP8, "--api-key", "sk-lab")
    srv.wait_ready()
    assert srv.get("/v1/loads?include=core")[0] == 401
    code, body = srv.get("/v1/loads?include=core", {"Authorization": "Bearer sk-lab"})
    document = json.loads(body)
    assert code == 200 and document["dp_rank_count"] == 1 and document["aggregate"]["total_reqs"] == 0
    assert set(document["loads"][0]) >= {"dp_rank", "num_running_reqs", "num_waiting_reqs", "num_total_reqs"}
    assert "Endpoint '/get_load' is deprecated" not in srv.log
    assert srv.get("/get_load", {"Authorization": "Bearer sk-lab"})[0] == 200
    assert "Endpoint '/get_load' is deprecated and will be removed in a future version." in srv.log


# ------------------------------------------------------------------------------------------------ faults

def test_fault_oom_weight_load(lab):
    srv = lab.start(*TP8, faults=[{"fault": "oom_weight_load", "profile": "tp8", "flags": {"tp_size": 8}}])
    assert srv.wait_exit() == -signal.SIGKILL
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in srv.log
    assert "Load weight end." not in srv.log and PARENT_DIES in srv.log


def test_fault_applies_only_to_matching_flags(lab):
    srv = lab.start(*TP8, faults=[{"fault": "crash", "flags": {"tp_size": 8, "ep_size": 4}}])
    srv.wait_ready()


def test_fault_oom_kv_cache(lab):
    srv = lab.start(*TP8, faults=[{"fault": "oom_kv_cache"}])
    assert srv.wait_exit() == -signal.SIGKILL
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in srv.log
    assert "Load weight end." in srv.log and PARENT_DIES in srv.log


def test_fault_oom_cuda_graph(lab):
    srv = lab.start(*TP8, faults=[{"fault": "oom_cuda_graph"}])
    assert srv.wait_exit() == -signal.SIGKILL
    assert "Capture cuda graph begin." in srv.log
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" in srv.log
    assert "allocated in private pools (e.g., CUDA Graphs)" in srv.log


def test_only_the_main_thread_takes_the_signals_that_end_the_server(lab):
    # A SIGQUIT from a failing rank handed to a helper thread used to leave the main thread asleep and the
    # server alive (CI saw it once in ~40 runs); every thread but the main one must block these signals.
    srv = lab.start(*TP8)
    srv.wait_ready()
    wanted = {signal.SIGQUIT, signal.SIGTERM, signal.SIGINT}
    checked = 0
    for tid in os.listdir(f"/proc/{srv.proc.pid}/task"):
        if int(tid) == srv.proc.pid:
            continue
        try:  # a request's thread may end between the listing and the read
            status = Path(f"/proc/{srv.proc.pid}/task/{tid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
        assert all(blocked & (1 << (sig - 1)) for sig in wanted), (tid, hex(blocked))
        checked += 1
    assert checked, "the server runs helper threads (HTTP, the rank watcher)"


def test_fault_on_a_flag_left_unset_matches_although_sglang_fills_its_default(lab):
    # null: the flag is not on the command line; the simulator fills cuda_graph_max_bs as ServerArgs does
    srv = lab.start(*TP8, faults=[{"fault": "oom_cuda_graph", "flags": {"tp_size": 8, "cuda_graph_max_bs": None}}])
    assert srv.wait_exit() == -signal.SIGKILL
    assert "Exception: Capture cuda graph failed: CUDA out of memory." in srv.log


def test_fault_crash_is_an_nccl_error(lab):
    srv = lab.start(*TP8, faults=[{"fault": "crash"}])
    assert srv.wait_exit() == -signal.SIGKILL
    assert "torch.distributed.DistBackendError: NCCL error in:" in srv.log
    assert "unhandled system error" in srv.log and PARENT_DIES in srv.log


def test_fault_hang_stops_after_nccl_init_begins(lab):
    srv = lab.start(*TP8, faults=[{"fault": "hang"}])
    srv.wait_log("Init torch distributed begin.")
    time.sleep(1.5)  # a start goes past NCCL init in well under a simulated second: this one stays there
    assert srv.proc.poll() is None
    lines = [ln for ln in srv.log.splitlines() if ln.strip()]
    assert lines[-1].endswith("Init torch distributed begin.")
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", srv.port), timeout=0.5):
        pass


def test_fault_port_in_use(lab):
    srv = lab.start(*TP8, faults=[{"fault": "port_in_use"}])
    assert srv.wait_exit() == 1
    assert (f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {srv.port}): "
            "address already in use") in srv.log


def test_fault_oom_runtime_serves_n_requests_then_dies_in_the_forward_pass(lab):
    srv = lab.start(*TP8, faults=[{"fault": "oom_runtime", "after_requests": 2}])
    srv.wait_ready()
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()

    def generate() -> int:
        req = urllib.request.Request(srv.url("/generate"), data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status

    assert [generate(), generate()] == [200, 200]
    assert srv.proc.poll() is None
    with pytest.raises(OSError):  # the third request's forward pass runs out of memory; the connection drops
        generate()
    assert srv.wait_exit() == -signal.SIGKILL
    log = srv.log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "in forward_batch_generation" in log and "in forward_extend" in log
    assert re.search(r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate [\d.]+ (MiB|GiB)\. GPU 0 "
                     r"has a total capacity of 94\.97 GiB of which [\d.]+ [MG]iB is free\.", log)
    assert log.index("The server is fired up and ready to roll!") < log.index("Scheduler hit an exception")
    assert PARENT_DIES in log


def test_a_gpu_that_falls_off_the_bus_fails_its_rank_and_the_next_start(lab, tmp_path):
    """lab.py fault xid79: the rank on the lost GPU fails its next kernel launch with the CUDA error PyTorch raises,
    the server dies the SIGQUIT way; until the host reboots (/run cleared) a start fails CUDA's init, and nvidia-smi
    cannot open the GPU."""
    srv = lab.start(*TP8)
    srv.wait_ready()
    run = tmp_path / "run"
    run.mkdir()
    (run / "lost.json").write_text("[3]")
    assert srv.wait_exit() == -signal.SIGKILL
    log = srv.log
    assert re.search(r"TP3\] Scheduler hit an exception: Traceback", log), log[-2000:]
    assert "torch.AcceleratorError: CUDA error: unspecified launch failure" in log and PARENT_DIES in log
    again = lab.start(*TP8)
    assert again.wait_exit() == -signal.SIGKILL
    assert "CUDA unknown error" in again.log
    smi = subprocess.run([sys.executable, str(NVIDIA_SMI), "-L"], capture_output=True, text=True)
    assert smi.returncode == 15
    assert smi.stdout == ("Unable to determine the device handle for GPU 0000:61:00.0: GPU is lost.  Reboot the "
                          "system to recover this GPU\n")


def test_an_nccl_hang_stops_every_request_and_fails_health_after_its_timeout(lab, tmp_path, monkeypatch):
    """lab.py fault hang: no token advances and no error is printed; /health answers 503 after
    SGLANG_HEALTH_CHECK_TIMEOUT (here 2 s) with SGLang's own line, as http_server.health_generate does."""
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2")
    srv = lab.start(*TP8)
    srv.wait_ready()
    run = tmp_path / "run"
    run.mkdir()
    (run / "nccl-hang").touch()
    body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(srv.url("/generate"), data=body, headers={"content-type": "application/json"})
    with pytest.raises(OSError):  # timed out: the request does not advance
        urllib.request.urlopen(req, timeout=3)
    started = time.monotonic()
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(srv.url("/health"), timeout=10)
    assert answer.value.code == 503 and time.monotonic() - started >= 2
    assert "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds." in srv.log
    assert srv.proc.poll() is None and "Traceback" not in srv.log
    (run / "nccl-hang").unlink()  # what a reboot does
    with urllib.request.urlopen(srv.url("/health"), timeout=10) as resp:
        assert resp.status == 200


def test_real_port_conflict_fails_the_same_way(lab):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        srv = lab.start(*TP8, port=s.getsockname()[1])
        assert srv.wait_exit() == 1
        assert "[Errno 98] error while attempting to bind on address" in srv.log


def test_fault_stale_gpu_process_survives_and_causes_the_next_oom(lab):
    srv = lab.start(*TP8, faults=[{"fault": "stale_gpu_process", "gpus": [0, 1], "mib": 40960}])
    assert srv.wait_exit() == -signal.SIGKILL
    assert "torch.OutOfMemoryError" in srv.log
    stale = lab.apps()
    assert len(stale) == 2 and {a[2] for a in stale} == {"40960 MiB"}
    pid = int(stale[0][0])
    assert f"Process {pid} has 40.00 GiB memory in use." in srv.log
    again = lab.start(*TP8)  # no fault this time: the leftover alone makes it OOM
    assert again.wait_exit() == -signal.SIGKILL
    assert "torch.OutOfMemoryError" in again.log
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert lab.used_mib() == [0] * 8
    lab.start(*TP8).wait_ready()
