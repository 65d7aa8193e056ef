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


# --- the GPU as operators know it (issue 15) -------------------------------------------------------------

CONFIG = ["plan", "--model-config", K26]


def run_plain(capsys, *args):
    code = main([*CONFIG, *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_gpu_by_name_takes_both_figures_from_the_table(capsys):
    code, out, err = run_plain(capsys, "--gpu", "RTX PRO 6000", "--json")
    assert code == 0, err
    by_name = json.loads(out)
    code, out, _ = run_plain(capsys, "--gpu-memory-gib", "94.97", "--gpu-memory-total-mib", "97887", "--json")
    assert json.loads(out) == by_name
    # nvidia-smi's name column, any case, with the NVIDIA prefix
    code, out, _ = run_plain(capsys, "--gpu", "nvidia rtx pro 6000 blackwell server edition", "--json")
    assert json.loads(out) == by_name


def test_gpu_memory_mib_as_nvidia_smi_prints_it_matches_the_name(capsys):
    _, by_name, _ = run_plain(capsys, "--gpu", "RTX PRO 6000", "--json")
    code, by_mib, err = run_plain(capsys, "--gpu-memory-mib", "97887", "--json")
    assert code == 0, err
    assert json.loads(by_mib) == json.loads(by_name)
    # 97887 MiB read as GiB (95.59) would plan a larger pool: the table's 94.97 is what decides
    _, naive, _ = run_plain(capsys, "--gpu-memory-gib", str(97887 / 1024), "--gpu-memory-mib", "97887", "--json")
    assert json.loads(naive)[0]["kv_tokens"] > json.loads(by_mib)[0]["kv_tokens"]


def test_table_header_names_the_gpu_and_both_figures(capsys):
    code, out, _ = run_plain(capsys, "--gpu", "H200", "--profile", "tp8")
    assert out.splitlines()[0] == "8 GPUs x H200 (143,771 MiB in nvidia-smi, 139.8 GiB in PyTorch)"


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (["--gpu", "RTX PRO 600"], "--gpu: Unknown GPU 'RTX PRO 600'. Did you mean 'RTX PRO 6000'"),
        (["--gpu", "A100"], "--gpu: Unknown GPU 'A100'. Known: 'RTX PRO 6000 Blackwell Server Edition'"),
        (["--gpu-memory-mib", "12345"], "--gpu-memory-mib: nvidia-smi's memory.total 12345 MiB is not a GPU"),
        (["--gpu", "H100", "--gpu-memory-gib", "79"], "--gpu 'H100' already gives both memory figures"),
        ([], "Say which GPU: --gpu 'RTX PRO 6000'"),
        (["--gpu-memory-gib", "1e9"], "--gpu-memory-gib 1e+09 is not usable; give a finite number above 0, at most"),
        (["--gpu-memory-mib", "inf"], "--gpu-memory-mib inf is not usable"),
        (["--gpu-memory-mib", "-97887"], "--gpu-memory-mib -97887 is not usable"),
        (["--gpu", "B200", "--gpus", "0"], "--gpus 0 is out of range"),
        (["--gpu", "B200", "--tp-size", "0"], "--tp 0 is out of range"),
        (["--gpu", "B200", "tp2-ep4"], "Unknown profile 'tp2-ep4'; did you mean tp2ep4? valid profiles: tp8,"),
        (["--gpu", "B200", "--profile", "TP2EP4"], "Unknown profile 'TP2EP4'; did you mean tp2ep4?"),
        (["--gpu", "B200", "ep9"], "Unknown profile 'ep9'; did you mean ep8?"),
    ],
)
def test_gpu_and_name_input_is_refused_naming_the_flag(capsys, args, sentence):
    code, out, err = run_plain(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith("moefleet plan: " + sentence), err
    assert len(err.strip().splitlines()) == 1


def test_sglang_flag_spellings_and_profile_names_are_accepted(capsys):
    _, short, _ = run_plain(capsys, "--gpu", "RTX PRO 6000", "--tp", "8", "--ep", "4", "--json")
    code, long_, err = run_plain(capsys, "--gpu", "RTX PRO 6000", "--tp-size", "8", "--ep-size", "4", "--json")
    assert code in (0, 1), err
    assert json.loads(long_) == json.loads(short)
    code, out, _ = run_plain(
        capsys, "--gpu", "RTX PRO 6000", "--tp-size", "8", "--ep-size", "8", "--dp-size", "8",
        "--enable-dp-attention", "--json",
    )
    assert json.loads(out)[0]["flags"] == {"tp_size": 8, "ep_size": 8, "dp_size": 8, "enable_dp_attention": True}
    code, out, _ = run_plain(capsys, "--gpu", "RTX PRO 6000", "tp2ep4", "pp8", "--json")
    assert code == 0 and [r["profile"] for r in json.loads(out)] == ["tp2ep4", "pp8"]


def test_a_profile_name_read_literally_gets_did_you_mean(capsys):
    # "TP2 EP4" typed as SGLang flags: a 2-GPU world with 4 expert groups, which SGLang refuses (tp % ep)
    code, out, _ = run_plain(capsys, "--gpu", "RTX PRO 6000", "--tp", "2", "--ep", "4", "--json")
    (row,) = json.loads(out)
    assert code == 1 and row["verdict"] == "invalid"
    assert "Did you mean profile tp2ep4 (--tp-size 8 --ep-size 4)?" in row["reason"]
    code, out, _ = run_plain(capsys, "--gpu", "RTX PRO 6000", "--tp", "2", "--pp", "4", "--json")
    assert "Did you mean" not in json.loads(out)[0]["reason"]  # that one is the profile tp2pp4 itself


def test_table_and_sentence_round_weights_alike(capsys):
    code, out, _ = run_plain(capsys, "--gpu", "RTX PRO 6000")
    lines = out.splitlines()
    table = {line.split()[0]: line for line in lines[3:11]}
    sentences = {line.split(":")[0]: line for line in lines[12:]}
    assert set(table) == set(sentences)
    for name, line in table.items():
        weights = line.split("GiB")[0].split()[-1]
        assert sentences[name].split(": ", 1)[1].startswith(f"{weights} GiB of weights per GPU"), name


def test_plot_draws_a_png_per_profile(capsys, tmp_path):
    png = tmp_path / "plan.png"
    code, out, err = run_plain(capsys, "--gpu", "RTX PRO 6000", "--plot", str(png))
    assert code == 0 and f"drew {png}" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    code, _, err = run_plain(capsys, "--gpu", "RTX PRO 6000", "--plot", str(tmp_path / "plan.svg"))
    assert code == 2 and "must name a .png file" in err


def test_plot_segments_add_up_to_the_gpu(capsys):
    from moefleet.commands.plan import memory_segments

    code, out, _ = run_plain(capsys, "--gpu", "RTX PRO 6000", "--json")
    gpu = {"name": "x", "smi_mib": 97887.0, "gib": 94.97}
    for row in json.loads(out):
        segments = dict(memory_segments(row, gpu))
        assert sum(segments.values()) == pytest.approx(97887 / 1024, abs=0.01), row["profile"]
        assert segments["KV pool"] == pytest.approx(row["kv_pool_bytes"] / 2**30)
        assert segments["driver reserved"] == pytest.approx(97887 / 1024 - 94.97)
        weights = sum(v for k, v in segments.items() if k.startswith("weights"))
        assert weights == pytest.approx(row["weights_bytes_per_gpu"] / 2**30)
