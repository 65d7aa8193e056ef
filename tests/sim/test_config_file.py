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
