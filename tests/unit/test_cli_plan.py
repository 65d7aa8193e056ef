"""moefleet plan: exit codes, table, JSON shape, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moefleet.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "model-configs"
K26 = str(DATA / "kimi-k2.6-config.json")
BASE = ["plan", "--model-config", K26, "--gpus", "8", "--gpu-memory-gib", "94.97"]


def run(capsys, *extra):
    code = main([*BASE, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_whole_catalog_fits_and_prints_a_table(capsys):
    code, out, err = run(capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == ["profile", "flags", "gpus", "weights/GPU", "mem", "fraction", "KV", "tokens", "verdict"]
    names = [line.split()[0] for line in lines[3:11]]
    assert names == ["tp8", "ep8", "tp2ep4", "tp4ep2", "pp8", "tp2pp4", "tp4pp2", "ep8dpa"]
    assert "--tp-size 8 --ep-size 4" in out


def test_json_shape(capsys):
    code, out, _ = run(capsys, "--json", "--profile", "tp2ep4", "--profile", "pp8")
    assert code == 0
    rows = json.loads(out)
    assert [r["profile"] for r in rows] == ["tp2ep4", "pp8"]
    for row in rows:
        for key in ("profile", "flags", "gpus_used", "weights_gib_per_gpu", "kv_tokens", "verdict", "reason"):
            assert key in row
    assert rows[0]["flags"] == {"tp_size": 8, "ep_size": 4, "mem_fraction_static": 0.79}
    assert rows[0]["weights_gib_per_gpu"] == pytest.approx(rows[0]["weights_bytes_per_gpu"] / 2**30, abs=0.01)


def test_adhoc_tp8_reports_sglangs_default_fraction_and_the_one_to_set(capsys):
    # SGLang 0.5.10 builds KimiK25VisionConfig (27 layers, 1152 wide): 0.848 x 0.95 x 0.9576 = 0.771.
    code, out, _ = run(capsys, "--tp", "8", "--gpu-memory-total-mib", "97887", "--json")
    (row,) = json.loads(out)
    assert code == 1 and row["verdict"] == "oom"
    assert row["mem_fraction_static"] == row["sglang_default_mem_fraction_static"] == 0.771
    assert row["suggested_mem_fraction_static"] == 0.8 and row["max_mem_fraction_static"] == 0.848
    assert "Set mem_fraction_static 0.80 in the profile" in row["reason"]


def test_gpu_memory_total_below_the_pytorch_figure_is_bad_input(capsys):
    code, _, err = run(capsys, "--gpu-memory-total-mib", "9000")
    assert code == 2 and "nvidia-smi's memory.total" in err


def test_seed_layout_exits_1_and_names_the_profile(capsys):
    code, out, _ = run(capsys, "--tp", "4", "--ep", "2", "--json")
    assert code == 1
    (row,) = json.loads(out)
    assert row["verdict"] == "oom" and row["gpus_used"] == 4
    assert row["suggested_profile"] == "tp4ep2"
    assert "Did you mean tp4ep2 (--tp-size 8 --ep-size 2)?" in row["reason"]


def test_invalid_adhoc_layout_exits_1(capsys):
    code, out, _ = run(capsys, "--tp", "8", "--ep", "3")
    assert code == 1
    assert "invalid" in out


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--profile", "nonsense"], "Unknown profile 'nonsense'; valid profiles: tp8, ep8,"),
        (
            ["--catalog", "/nonexistent/catalog.yml"],
            "The profile catalog /nonexistent/catalog.yml does not exist.",
        ),
        (["--profile", "tp8", "--tp", "8"], "Give either --profile or an ad-hoc layout"),
        (["--gpu-memory-gib", "nan"], "--gpu-memory-gib nan is not usable; give a finite number above 0"),
        (["--gpu-memory-gib", "inf"], "--gpu-memory-gib inf is not usable"),
        (["--gpu-memory-gib", "-94.97"], "--gpu-memory-gib -94.97 is not usable"),
        (["--gpu-memory-total-mib", "nan"], "--gpu-memory-total-mib nan is not usable"),
        (["--gpus", "-8"], "--gpus -8 is out of range; give a whole number from 1 to 64."),
        (["--gpus", "100000000000000000000"], "--gpus 100000000000000000000 is out of range"),
        (["--tp", "-2"], "--tp -2 is out of range"),
        (["--ep", "10000000000"], "--ep 10000000000 is out of range"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, sentence):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.startswith("moefleet plan: " + sentence)
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_missing_and_malformed_model_config(capsys, tmp_path):
    code = main(
        ["plan", "--model-config", str(tmp_path / "none.json"), "--gpus", "8", "--gpu-memory-gib", "94.97"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    code = main(["plan", "--model-config", str(broken), "--gpus", "8", "--gpu-memory-gib", "94.97"])
    err = capsys.readouterr().err
    assert code == 2 and "is not valid JSON (line 1" in err
    broken.write_text('{"hidden_size": 7168}')
    code = main(["plan", "--model-config", str(broken), "--gpus", "8", "--gpu-memory-gib", "94.97"])
    err = capsys.readouterr().err
    assert code == 2 and "lacks num_hidden_layers" in err


def test_bad_catalog_prints_path_and_message(capsys, tmp_path):
    catalog = tmp_path / "catalog.yml"
    catalog.write_text(
        "schema_version: 1\nnccl_sets: {p: {description: d, env: {}}}\n"
        "profiles: {x: {description: a profile here, flags: {tp_size: eight},"
        " gpus: 8, nccl: p, fallback: null}}\n"
    )
    code, out, err = run(capsys, "--catalog", str(catalog))
    assert code == 2
    assert f"{catalog}, line 3: profiles/x/flags/tp_size: 'eight' is not of type 'integer'" in err
    catalog.write_text("schema_version: 1\nprofiles: [\n  x: {}\n")
    code, out, err = run(capsys, "--catalog", str(catalog))
    assert code == 2 and err.startswith(f"moefleet plan: {catalog}, line 4, column 1: not valid YAML")
    assert "Traceback" not in err


def test_extra_profiles_are_planned(capsys, tmp_path):
    extra = tmp_path / "extra.yml"
    extra.write_text(
        "mine:\n  description: TP8 with an FP8 KV cache.\n"
        "  flags: {tp_size: 8, mem_fraction_static: 0.8, kv_cache_dtype: fp8_e4m3}\n"
        "  gpus: 8\n  nccl: pcie_shm\n  fallback: ep8\n"
    )
    code, out, _ = run(capsys, "--extra-profiles", str(extra), "--profile", "mine", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["kv_bytes_per_token"] == (512 + 64) * 61
