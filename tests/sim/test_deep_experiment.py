"""``pgc-hvd experiment deep --quick``: MNIST-1D + the 1-D CNN on the simulator.
Structure and "every scheme learned" are asserted, not the verdicts (docs/experiments.md)."""

import json

import pytest
import torch

from pgc_hvd.cli import main

pytest.importorskip("mnist1d")


def test_cnn1d_fits_mnist1d_shapes():
    from pgc_hvd.data import Dataset
    from pgc_hvd.models import build_task
    import numpy as np
    ds = Dataset(np.zeros((4, 1, 40), np.float32), np.arange(4), 10, "mnist1d")
    task = build_task("cnn1d", ds)
    assert task.model(torch.zeros(4, 1, 40)).shape == (4, 10)
    assert sum(p.numel() for p in task.model.parameters()) < 10_000   # small, for the CPU
    with pytest.raises(ValueError, match="sequence inputs"):
        build_task("cnn1d", Dataset(np.zeros((2, 1, 8, 8), np.float32), np.arange(2), 2))


@pytest.mark.slow
def test_experiment_deep_quick(tmp_path):
    from pgc_hvd.apps.deep_experiment import SCHEMES
    assert main(["experiment", "deep", "--quick", "--out", str(tmp_path)]) == 0
    for f in ("summary.json", "table.md", "plot.png"):
        assert (tmp_path / f).stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    runs, groups = summary["runs"], summary["groups"]
    assert summary["dataset"] == "mnist1d" and summary["model"] == "cnn1d"
    assert len(list((tmp_path / "records").glob("*.jsonl"))) == len(runs) + len(summary["staleness"])
    # every scheme of the PGC comparison, plain SGD and momentum with the remedy on and off,
    # both straggler policies
    assert {r["scheme"] for r in runs} == {name for name, _ in SCHEMES}
    assert {r["opt"] for r in runs} == {"sgd", "mom", "mom-off"}
    assert {r["policy"] for r in runs} == {"continue", "cancel"}
    for g in groups:
        for key in ("steps_to_target", "time_to_target"):
            assert set(g[key]) == {"median", "lo", "hi"}
        assert {"err_total_mean", "err_coding_mean", "err_stale_mean", "time_vs_dgd"} <= set(g)
    # every scheme learned: validation accuracy above chance (0.1) at some evaluation
    assert all(r["best_accuracy"] > 0.15 for r in runs), [(r["label"], r["best_accuracy"]) for r in runs]
    # the remedy shows in the records: stale schemes get mu_imp > 0 unless it is switched off
    by = {(r["scheme"], r["opt"], r["policy"]): r for r in runs}
    assert by[("pgc-cr", "mom", "continue")]["implicit_momentum_mean"] > 0
    assert by[("pgc-cr", "mom-off", "continue")]["implicit_momentum_mean"] == 0
    assert by[("dgd", "mom", "continue")]["implicit_momentum_mean"] == 0
    # the design note's experiment on the same workload
    st = summary["staleness"]
    assert [r["variant"] for r in st] == ["sync-dp", "gc", "bounded c=2", "bounded c=4", "bounded c=8",
                                            "bounded c=2 once", "bounded c=4 once",
                                            "bounded c=8 once"]
    assert all(r["max_age"] < 8 for r in st) and st[4]["max_age"] > 0   # the note's c = 8
    assert {c["claim"] for c in summary["claims"]} >= {"PGC-CR needs fewer steps than DGD",
                                                       "GC is slower per step than DGD"}


def test_deep_grids_for_decays_and_adam():
    """``--grid decay --decays`` sweeps the given rho (names carry them); ``--grid adam`` runs
    DGD, IS-SGD, PGC-CR with the remedy and with the paper's ring under Adam; bad decays are
    refused before anything runs."""
    from pgc_hvd.apps.deep_experiment import ADAM, grid, main as deep_main
    specs = grid(False, 2, "decay", decays=(0.1, 0.05))
    assert sorted({s["variant"] for s in specs}) == ["dgd", "is-sgd", "pgc-cr decay=0.05",
                                                     "pgc-cr decay=0.1"]
    assert len(specs) == 8 and all(s["optimizer"] == "sgd:lr=0.1,momentum=0.9" for s in specs)
    adam = grid(False, 1, "adam")
    assert [s["variant"] for s in adam] == ["dgd", "is-sgd", "pgc-cr", "pgc-cr decay=1"]
    assert all(s["optimizer"] == ADAM and s["correction"] for s in adam)
    for bad in ("1,2", "a,b"):
        with pytest.raises(SystemExit):
            deep_main(["--out", "unused", "--grid", "decay", "--decays", bad])


def test_deep_staleness_grid_quick(tmp_path):
    """``--grid staleness --quick``: sync DP, GC, bounded staleness with the default remedy and
    with it off (the note's rule), one seed, 30 s; the remedy shows in the records (each
    gradient counted once: weight per step below 1, no replayed-only step)."""
    from pgc_hvd.metrics.records import read_records
    assert main(["experiment", "deep", "--grid", "staleness", "--quick", "--cs", "4",
                 "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [g["variant"] for g in summary["groups"]] == ["sync-dp", "gc", "bounded c=4",
                                                         "bounded c=4 remedy off"]
    for g in summary["groups"]:
        assert {"time_to_target", "accuracy_at_equal_time", "grad_flops", "utilisation",
                "max_age", "err_total_mean"} <= set(g)
        assert g["grad_flops"]["median"] > 0
    assert {c["variant"] for c in summary["claims"]} == {"bounded c=4", "bounded c=4 remedy off"}
    on = list(read_records(tmp_path / "records" / "stale_mnist1d_bounded_c4_seed0.jsonl"))
    off = list(read_records(tmp_path / "records" / "stale_mnist1d_bounded_c4_remedy_off_seed0.jsonl"))
    assert all(r["extra"]["n_fresh"] >= 7 for r in on[1:])       # min_fresh = n - s
    assert all(r["extra"]["n_fresh"] == len(r["workers_used"]) for r in on)
    assert all("n_fresh" not in r["extra"] for r in off)          # the note's records, as before
    assert all(len(r["workers_used"]) == 8 for r in off)
    assert (tmp_path / "plot.png").stat().st_size > 0
