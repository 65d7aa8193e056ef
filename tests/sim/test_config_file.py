"""--config FILE: SGLang reads server args from a YAML file, the command line winning (the unit passes
the API key this way, from a systemd credential)."""

from sglang._sim.args import parse_args


def test_config_file_supplies_args_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "secrets.yaml"
    cfg.write_text('# managed\napi-key: "k\\"ey"\nenable_metrics: true\ntp-size: 4\n')
    args = parse_args(["--model-path", "/m", "--config", str(cfg), "--tp-size", "8"])
    assert args.api_key == 'k"ey'
    assert args.enable_metrics is True
    assert args.tp_size == 8


def test_without_config_no_api_key():
    assert parse_args(["--model-path", "/m"]).api_key is None


def test_fault_matching_null_flags_and_env(monkeypatch):
    from sglang._sim.faults import _env_matches, _matches

    untuned = parse_args(["--model-path", "/m", "--tp-size", "8"])
    tuned = parse_args(["--model-path", "/m", "--tp-size", "8", "--mem-fraction-static", "0.84"])
    flags = {"tp_size": 8, "mem_fraction_static": None}
    assert _matches(untuned, flags) and not _matches(tuned, flags)
    monkeypatch.delenv("NCCL_P2P_DISABLE", raising=False)
    assert _env_matches({"NCCL_P2P_DISABLE": None})
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert not _env_matches({"NCCL_P2P_DISABLE": None})
