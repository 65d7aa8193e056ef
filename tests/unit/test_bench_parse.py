"""moefleet bench parse: every real output in tests/data/bench-outputs/ read value by value, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils.bench_results import FIELDS, parse_text

from moefleet.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "bench-outputs"

# Per file: the values each result must carry (every other field of FIELDS must be None), and its extra rows.
EXPECTED = {
    "01-v0.2-pr685.jsonl": [
        ({"backend": "sglang", "request_rate": 1.0, "total_input_tokens": 14688, "total_generated_tokens": 12790,
          "median_ttft_ms": 32.953862100839615, "median_itl_ms": 12.583150564412666,
          "output_throughput": 187.74840245645584},
         {"dataset_name": "sharegpt", "sharegpt_output_len": None, "random_input_len": 1024,
          "random_output_len": 128}),
        ({"backend": "sglang", "request_rate": 2.0, "total_input_tokens": 14688, "total_generated_tokens": 12790,
          "median_ttft_ms": 31.570294871926308, "median_itl_ms": 13.26479745871364,
          "output_throughput": 344.5204016475801},
         {"dataset_name": "sharegpt", "sharegpt_output_len": None, "random_input_len": 1024,
          "random_output_len": 128}),
    ],
    "02-v0.3-issue2097.txt": [
        ({"backend": "sglang", "request_rate": 4.0, "successful_requests": 1200, "duration_s": 302.97,
          "total_input_tokens": 269081, "total_generated_tokens": 226901,
          "total_generated_tokens_retokenized": 226855, "request_throughput": 3.96, "input_throughput": 888.15,
          "output_throughput": 748.92, "total_throughput": 1637.07, "mean_e2e_latency_ms": 2564.81,
          "median_e2e_latency_ms": 1575.29, "mean_ttft_ms": 38.23, "median_ttft_ms": 31.98,
          "p99_ttft_ms": 95.83}, {}),
    ],
    "03-v0.4.0-issue2805.txt": [
        ({"backend": "sglang", "request_rate": "inf", "successful_requests": 1648, "duration_s": 170.41,
          "total_input_tokens": 369103, "total_generated_tokens": 326408,
          "total_generated_tokens_retokenized": 326356, "request_throughput": 9.67, "input_throughput": 2165.94,
          "output_throughput": 1915.40, "total_throughput": 4081.34, "mean_e2e_latency_ms": 80126.93,
          "median_e2e_latency_ms": 81160.44, "mean_ttft_ms": 44294.80}, {}),
    ],
    "04-pr4973.txt": [
        ({"backend": "sglang", "request_rate": "inf", "successful_requests": 10, "duration_s": 1.76,
          "total_input_tokens": 1997, "total_generated_tokens": 2798, "total_generated_tokens_retokenized": 2798,
          "request_throughput": 5.69, "input_throughput": 1136.26, "output_throughput": 1592.01,
          "total_throughput": 2728.27, "concurrency": 5.48, "mean_e2e_latency_ms": 963.65,
          "median_e2e_latency_ms": 1060.53, "mean_ttft_ms": 62.46, "median_ttft_ms": 63.38, "p99_ttft_ms": 69.76,
          "mean_tpot_ms": 3.29}, {}),
    ],
    "05-issue8285.txt": [
        ({"backend": "sglang", "request_rate": 330.0, "max_concurrency": 330, "successful_requests": 660,
          "duration_s": 55.42, "total_input_tokens": 675840, "total_generated_tokens": 675840,
          "total_generated_tokens_retokenized": 675679, "request_throughput": 11.91, "input_throughput": 12195.89,
          "output_throughput": 12195.89, "total_throughput": 24391.79, "concurrency": 315.98,
          "mean_e2e_latency_ms": 26530.12, "median_e2e_latency_ms": 26001.41, "mean_ttft_ms": 2533.44,
          "median_ttft_ms": 2409.87, "p99_ttft_ms": 6002.16, "mean_itl_ms": 23.46, "median_itl_ms": 22.82}, {}),
    ],
    "06-pr9428-fa4.txt": [
        ({"backend": "sglang", "request_rate": "inf", "successful_requests": 64, "duration_s": 15.30,
          "total_input_tokens": 2097122, "total_generated_tokens": 101, "total_generated_tokens_retokenized": 89,
          "request_throughput": 4.18, "input_throughput": 137022.74, "output_throughput": 6.60,
          "total_throughput": 137029.34, "concurrency": 49.12, "mean_e2e_latency_ms": 11746.39,
          "median_e2e_latency_ms": 15285.35, "mean_ttft_ms": 7252.11, "median_ttft_ms": 6711.85,
          "p99_ttft_ms": 15292.66, "mean_itl_ms": 8132.74, "median_itl_ms": 8584.20, "p95_itl_ms": 13752.97,
          "p99_itl_ms": 13753.42}, {}),
    ],
    "07-pr9812-sglang-oai-chat.txt": [
        ({"backend": "sglang-oai-chat", "request_rate": "inf", "successful_requests": 768, "duration_s": 80.33,
          "total_input_tokens": 784909, "total_input_text_tokens": 15373, "total_input_vision_tokens": 769536,
          "total_generated_tokens": 768, "total_generated_tokens_retokenized": 768, "request_throughput": 9.56,
          "input_throughput": 9771.56, "output_throughput": 9.56, "total_throughput": 9781.12,
          "concurrency": 507.40, "mean_e2e_latency_ms": 53069.90, "median_e2e_latency_ms": 53704.35,
          "mean_ttft_ms": 53069.87, "median_ttft_ms": 53704.31, "p99_ttft_ms": 78548.58, "mean_itl_ms": 0.0}, {}),
    ],
    "08-pr14194-trimmed.txt": [
        ({"backend": "sglang", "request_rate": 1000000.0, "max_concurrency": 48, "successful_requests": 480,
          "duration_s": 838.86, "total_input_tokens": 1920000, "total_input_text_tokens": 1920000,
          "total_generated_tokens": 720000, "total_generated_tokens_retokenized": 658869,
          "request_throughput": 0.57, "input_throughput": 2288.83, "output_throughput": 858.31,
          "peak_output_throughput": 1102.00, "peak_concurrent_requests": 96, "total_throughput": 3147.14,
          "concurrency": 47.99, "mean_e2e_latency_ms": 83871.51, "median_e2e_latency_ms": 82317.55,
          "p90_e2e_latency_ms": 86326.49, "p99_e2e_latency_ms": 95243.52, "mean_ttft_ms": 7707.16,
          "median_ttft_ms": 7702.06, "p99_ttft_ms": 12909.53}, {}),
    ],
    "09-pr33108-newest.txt": [
        ({"backend": "sglang", "request_rate": "inf", "max_concurrency": 4, "successful_requests": 32,
          "duration_s": 289.93, "total_input_tokens": 12778, "total_input_text_tokens": 12778,
          "total_generated_tokens": 18225, "total_generated_tokens_retokenized": 18167, "request_throughput": 0.11,
          "input_throughput": 44.07, "output_throughput": 62.86, "peak_output_throughput": 76.00,
          "peak_concurrent_requests": 5, "total_throughput": 106.93, "concurrency": 3.71,
          "mean_e2e_latency_ms": 33656.65, "median_e2e_latency_ms": 33559.75, "p90_e2e_latency_ms": 56060.61,
          "p99_e2e_latency_ms": 59795.16, "mean_ttft_ms": 756.09, "median_ttft_ms": 607.40},
         {"P95 E2E Latency (ms)": 57295.94}),
    ],
    "10-issue12389.jsonl": [
        ({"backend": "sglang", "request_rate": "inf", "max_concurrency": 16, "successful_requests": 300,
          "duration_s": 91.82476212800248, "total_input_tokens": 75000000, "total_input_text_tokens": 75000000,
          "total_input_vision_tokens": 0, "total_generated_tokens": 300000, "total_generated_tokens_retokenized": 0,
          "request_throughput": 3.267092590795978, "input_throughput": 816773.1476989945,
          "output_throughput": 3267.0925907959777, "mean_e2e_latency_ms": 4760.202868748844,
          "median_e2e_latency_ms": 4825.5520130333025, "p99_e2e_latency_ms": 5812.809163999625,
          "mean_ttft_ms": 0.0, "median_ttft_ms": 0.0, "p99_ttft_ms": 0.0, "mean_tpot_ms": 4.76496783658543,
          "median_tpot_ms": 4.830382395428731, "p99_tpot_ms": 5.818627791791416, "mean_itl_ms": 0.0,
          "median_itl_ms": 0.0, "p95_itl_ms": 0.0, "p99_itl_ms": 0.0, "concurrency": 15.552023523175109},
         {"dataset_name": "random", "sharegpt_output_len": None, "random_input_len": 250000,
          "random_output_len": 1000, "random_range_ratio": 1.0, "std_e2e_latency_ms": 698.243004441158,
          "std_ttft_ms": 0.0, "std_tpot_ms": 0.6989419463875456, "std_itl_ms": 0.0}),
    ],
}


def _check(result: dict, values: dict, extra: dict) -> None:
    for field in FIELDS:
        assert result[field] == values.get(field), field
    for field, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert type(result[field]) is type(value), field
    # accept_length: null in the 0.5 JSON line, so not a value
    assert {k: v for k, v in result["extra"].items()} == extra


def test_every_collected_file_is_covered():
    files = {p.name for p in DATA.iterdir() if p.suffix in (".txt", ".jsonl")}
    assert files == set(EXPECTED) | {"11-pr9812-no-values.txt"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_output_is_read_value_by_value(name):
    results = parse_text((DATA / name).read_text())
    assert len(results) == len(EXPECTED[name])
    for result, (values, extra) in zip(results, EXPECTED[name], strict=True):
        _check(result, values, extra)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_crlf_and_markdown_quoting_read_the_same(name):
    text = (DATA / name).read_text()
    plain = parse_text(text)
    assert parse_text(text.replace("\n", "\r\n")) == plain
    quoted = parse_text("".join("> " + line for line in text.splitlines(keepends=True)))
    assert [{k: v for k, v in r.items() if k != "line"} for r in quoted] == \
           [{k: v for k, v in r.items() if k != "line"} for r in plain]


def test_padding_trimmed_and_a_progress_bar_and_command_above():
    text = (DATA / "05-issue8285.txt").read_text()
    trimmed = "\n".join(" ".join(line.split()) for line in text.splitlines())
    bar = ("python3 -m sglang.bench_serving --backend sglang --max-concurrency 330 --request-rate 330\n"
           "  0%|          | 0/660 [00:00<?, ?it/s]\r 50%|█████     | 330/660 [00:27<00:27, 12.0it/s]\r"
           "100%|██████████| 660/660 [00:55<00:00, 11.91it/s]\n")
    (plain,) = parse_text(text)
    (other,) = parse_text(bar + trimmed)
    assert {k: v for k, v in other.items() if k != "line"} == {k: v for k, v in plain.items() if k != "line"}


def test_rows_cut_out_by_the_author_leave_the_others():
    text = (DATA / "06-pr9428-fa4.txt").read_text()
    lines = text.splitlines()
    start = lines.index("----------------End-to-End Latency----------------")
    end = lines.index("---------------Inter-Token Latency----------------")
    (result,) = parse_text("\n".join(lines[:start] + ["..."] + lines[end:]))
    assert result["median_e2e_latency_ms"] is None and result["median_ttft_ms"] is None
    assert result["output_throughput"] == 6.60 and result["p99_itl_ms"] == 13753.42


def test_a_block_cut_mid_way_keeps_the_rows_before_the_cut():
    text = (DATA / "08-pr14194-trimmed.txt").read_text()
    cut = text[:text.index("Total token throughput")] + "Total token thr"
    (result,) = parse_text(cut)
    assert result["peak_concurrent_requests"] == 96 and result["output_throughput"] == 858.31
    assert result["total_throughput"] is None and result["median_ttft_ms"] is None
    assert result["extra"] == {}


def test_two_blocks_and_a_json_line_in_one_paste_are_three_results():
    text = "\n".join((DATA / n).read_text() for n in ("05-issue8285.txt", "09-pr33108-newest.txt",
                                                       "10-issue12389.jsonl"))
    results = parse_text(text)
    assert [r["kind"] for r in results] == ["block", "block", "jsonl"]
    assert [r["max_concurrency"] for r in results] == [330, 4, 16]


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["bench", "parse", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_lists_one_object_per_result(capsys):
    code, out, err = _cli(capsys, DATA / "01-v0.2-pr685.jsonl", DATA / "03-v0.4.0-issue2805.txt", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert [d["output_throughput"] for d in data] == [187.74840245645584, 344.5204016475801, 1915.40]
    assert data[2]["max_concurrency"] is None and data[2]["request_rate"] == "inf"
    assert data[2]["file"].endswith("03-v0.4.0-issue2805.txt") and data[2]["line"] == 7
    assert set(FIELDS) | {"extra", "file", "line", "kind"} == set(data[0])


def test_cli_table(capsys):
    code, out, _ = _cli(capsys, DATA / "05-issue8285.txt")
    assert code == 0
    head, rule, row = out.splitlines()
    assert head.split()[:4] == ["source", "backend", "conc", "reqs"]
    assert row.split()[1:5] == ["sglang", "330", "660", "12195.89"]


def test_a_file_without_a_result_exits_2_naming_it(capsys):
    path = DATA / "11-pr9812-no-values.txt"
    code, out, err = _cli(capsys, path, DATA / "04-pr4973.txt")
    assert code == 2
    assert err.strip() == (
        f"moefleet bench parse: {path}: no SGLang benchmark result in it; expected the block `python -m "
        "sglang.bench_serving` prints (from its '============ Serving Benchmark Result ============' line) or "
        "the JSON lines of its --output-file.")
    assert "1592.01" in out  # the other file is still read


def test_a_log_without_any_result_exits_2(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text("[2026-12-01 03:00:00] The server is fired up and ready to roll!\nBackend: sglang\n")
    code, out, err = _cli(capsys, log, "--json")
    assert code == 2 and out.strip() == "[]"
    assert f"{log}: no SGLang benchmark result in it" in err


def test_missing_file_exits_2(capsys):
    code, _, err = _cli(capsys, "/nonexistent/bench.txt")
    assert code == 2 and "moefleet bench parse: /nonexistent/bench.txt: no such file." in err
