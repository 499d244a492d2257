"""The forward-builds study's host side: build names, and a clean refusal without a GPU."""
from __future__ import annotations

import pytest

from kernel.forward import Config, all_variants, auto_config
from kernel.studies.forward_builds.__main__ import AUTO, WITHOUT, launch_choice, main, parse_build

from ..scan_stand_ins import FORWARD


@pytest.mark.parametrize("cfg", all_variants() + [Config(warps=4, producers=2, nstage=5, g6_split=4, product_warps=2)],
                         ids=lambda c: c.name())
def test_a_config_name_gives_its_config_back(cfg):
    assert parse_build(cfg.name(), auto_config(8)) == cfg


def test_auto_and_auto_without_products():
    auto = auto_config(1)
    assert auto.product_warps == 2
    assert parse_build(AUTO, auto) == auto
    assert parse_build(WITHOUT, auto) == Config(warps=1, producers=4, nstage=auto.nstage, g6_split=4)


def test_an_unknown_build_is_named_before_any_gpu_work(capsys):
    assert main(["--builds", "auto,w1-p4"]) == 2
    assert "build 'w1-p4': expected auto, auto-without-products or a Config name" in capsys.readouterr().err


@pytest.mark.parametrize("sequences, heads, name", [(1, 16, "w1-p4-st5-g4-pw2"), (1, 32, "w2-p4-st5-g4-pw2"),
                                                    (4, 16, "w4-p2-st5-g4-pw2"), (32, 16, "w8-p2-st4-g4")])
def test_auto_is_the_launchs_own_choice(sequences, heads, name):
    # the launch's plan on stand-ins of the study's shapes (one long sequence, or a batch of them), 132 SMs
    a, _ = FORWARD.args(B=sequences, T=131072 // sequences, H=heads)
    assert launch_choice(a["q"], a["k"], a["v"], a["g"], a["beta"], None, 132).name() == name


def test_the_ops_form_runs_each_build_as_its_token_gate_and_rstd_build():
    from kernel.studies.forward_builds.__main__ import in_form, parse_args

    auto = auto_config(8)
    assert in_form(parse_build("w8-p4-st4-g4", auto), "op").name() == "w8-p4-st4-g4-tg-rs"
    assert in_form(parse_build("w8-p2-st4-g4-pw2", auto), "op").name() == "w8-p2-st4-g4-pw2-tg-rs"
    assert in_form(auto, "normalised") == auto
    assert parse_args(["--inputs", "op"]).inputs == "op" and parse_args([]).inputs == "normalised"
    with pytest.raises(SystemExit):
        parse_args(["--inputs", "raw"])


def test_auto_on_the_ops_form_is_the_launchs_token_gate_and_rstd_build():
    import numpy as np

    from ..scan_stand_ins import DeviceArray

    a, _ = FORWARD.args(B=32, T=8192, H=32)
    rstd = tuple(DeviceArray((32, 8192, 32), np.float32) for _ in range(2))
    assert launch_choice(a["q"], a["k"], a["v"], a["g"], a["beta"], None, 132, token_gate=True,
                         rstd=rstd).name() == "w8-p2-st4-g4-pw2-tg-rs"


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["normalised", "op"])
def test_each_build_is_timed_on_either_form_with_the_first_builds_bits(form):
    pytest.importorskip("torch")
    from kernel.studies.forward_builds.__main__ import measure

    rows = measure("2x512", 2, [AUTO, WITHOUT], reps=2, form=form)
    assert [r["build"] for r in rows] == [AUTO, WITHOUT] and all(r["inputs"] == form for r in rows)
    assert all(r["name"].endswith("-tg-rs") == (form == "op") for r in rows), rows
    assert all(r["ms"] > 0 for r in rows)
    assert all(rows[1]["same_bits"].values()), rows[1]   # the product warps form the same products
