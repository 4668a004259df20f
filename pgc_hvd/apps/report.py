"""``pgc-hvd report RUN_DIR``: a table and a plot from step records.

RUN_DIR is one run (it holds ``records.jsonl``), a folder of runs (sub-folders that do), or an
experiment's output (``records/<run>.jsonl``, as ``pgc-hvd experiment`` writes).
Prints one row per run (steps, mean/median step time, time to the target loss, final loss and
accuracy from ``summary.json`` when present, mean messages used, mean busy fraction) and writes
``RUN_DIR/report.md`` and ``RUN_DIR/report.png`` (training loss against wall time, and step-time
distributions). Made from the records only, so simulated and real runs compare the same way.

A run with ``stragglers="auto"`` (docs/control.md, "s chosen online") changes s at its
switches, each in a step record's ``extra["auto_s"]`` (the simulator's and the runtime's
alike, with the step before which it took effect): its ``s`` column reads ``auto 0->2`` (the
s it started at, then each new one), ``report.md`` lists every switch (its step, the time,
old -> new and the rule's reason), and the plot marks each on the loss curve at that time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from pgc_hvd.metrics.records import read_records
from pgc_hvd.metrics.targets import RUNTIME_WINDOW, first_reaching

from .tables import markdown_table


def find_runs(root: Path) -> list[Path]:
    """The records files of the runs under root (see the module docstring)."""
    if (root / "records.jsonl").exists():
        return [root / "records.jsonl"]
    runs = sorted(root.glob("*/records.jsonl"))
    return runs or sorted((root / "records").glob("*.jsonl"))


def read_summary(path: Path) -> dict:
    """A run's summary.json as a dict ({} when there is none); a damaged one (not UTF-8 JSON, not
    an object, a target_loss that is not a number) is a ValueError naming the file."""
    if not path.exists():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, IsADirectoryError) as err:
        raise ValueError(f"{path}: damaged, not a JSON summary ({err}); remove it, or rerun the "
                         "run, to report from the records alone") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: a JSON {type(summary).__name__}, not the summary object a run "
                         "writes")
    target = summary.get("target_loss")
    if target is not None and (not isinstance(target, (int, float)) or isinstance(target, bool)):
        raise ValueError(f"{path}: target_loss is {target!r}, not a number")
    return summary


def summarize(records_file: Path, target: float | None) -> dict:
    """One row: a run's records, plus its summary.json when the run has a folder of its own."""
    recs = list(read_records(records_file))
    own_folder = records_file.name == "records.jsonl"
    run = records_file.parent if own_folder else records_file.with_suffix("")
    summary = read_summary(run / "summary.json") if own_folder else {}
    if target is None:
        target = summary.get("target_loss", 0.5)
    st = [r["step_time"] for r in recs if r.get("step_time") is not None]
    busy = []
    for r in recs:
        if r.get("busy") and r.get("step_time"):
            busy.extend(min(1.0, b / r["step_time"]) for b in r["busy"] if b is not None)
    moves = switches(recs)
    s = recs[0].get("s") if recs else None
    if moves:   # stragglers="auto": where it started, then each switch
        s = "auto " + "->".join(str(v) for v in [moves[0]["old_s"]] + [m["new_s"] for m in moves])
    return {
        "run": run.name, "scheme": recs[0].get("scheme") if recs else summary.get("scheme"),
        "n": recs[0].get("n") if recs else None, "s": s, "_switches": moves,
        "steps": len(recs),
        "mean_step_ms": 1e3 * statistics.fmean(st) if st else None,
        "median_step_ms": 1e3 * statistics.median(st) if st else None,
        "target_loss": target, "time_to_target_s": first_reaching(recs, target, window=RUNTIME_WINDOW)[1],
        # pgc-hvd train writes final_*; pgc-hvd simulate test_accuracy / final_loss
        "final_test_accuracy": summary.get("final_test_accuracy", summary.get("test_accuracy")),
        "final_train_loss": summary.get("final_train_loss", summary.get("final_loss")),
        "mean_used": statistics.fmean(len(r.get("workers_used", ())) for r in recs) if recs else None,
        "busy_fraction": statistics.fmean(busy) if busy else None,
        "wall_s": recs[-1]["time"] if recs else None,
        "_records": recs,
    }


def switches(recs: list[dict]) -> list[dict]:
    """The run's switches of s (``stragglers="auto"``), in order: each switch dict of a
    record's ``extra["auto_s"]`` with ``time``, that record's wall time (a field every record
    has; the switch took effect before its step). A record whose ``auto_s`` is not a list of
    switch objects is a ValueError naming the step."""
    out = []
    for r in recs:
        moves = (r.get("extra") or {}).get("auto_s")
        if moves is None:
            continue
        if not (isinstance(moves, list) and all(isinstance(m, dict) and {"step", "old_s", "new_s"}
                                                <= m.keys() for m in moves)):
            raise ValueError(f"the record of step {r['step']}: extra.auto_s is {moves!r}, "
                             f"not a list of switches (step, old_s, new_s, reason) as "
                             f"stragglers='auto' writes them")
        out.extend(dict(m, time=r["time"]) for m in moves)
    return out


def switches_text(rows: list[dict]) -> str:
    """``report.md``'s list of each auto run's switches ('' when no run switched)."""
    lines = []
    for r in rows:
        for m in r["_switches"]:
            lines.append(f"* {r['run']}: before step {m['step']} ({m['time']:.1f} s): "
                         f"s {m['old_s']} -> {m['new_s']}: {m.get('reason', '')}".rstrip(": "))
    if not lines:
        return ""
    return "\n\nSwitches of s (stragglers=\"auto\"):\n\n" + "\n".join(lines) + "\n"


def _fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


COLUMNS = [("run", "run"), ("scheme", "scheme"), ("n", "n"), ("s", "s"), ("steps", "steps"),
           ("mean_step_ms", "ms/step"), ("median_step_ms", "median ms"),
           ("time_to_target_s", "time to target (s)"), ("final_train_loss", "final loss"),
           ("final_test_accuracy", "test acc"), ("mean_used", "msgs used"),
           ("busy_fraction", "busy frac"), ("wall_s", "wall (s)")]


def table(rows: list[dict]) -> str:
    return markdown_table([h for _, h in COLUMNS],
                          [[_fmt(r[k], 1 if k.endswith("_ms") else 3) for k, _ in COLUMNS]
                           for r in rows])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        recs = [x for x in r["_records"] if x.get("loss") is not None]
        line, = a.plot([x["time"] for x in recs], [x["loss"] for x in recs], label=r["run"],
                       lw=1.2)
        for m in r["_switches"]:   # stragglers="auto": each switch where it took effect
            a.axvline(m["time"], color=line.get_color(), ls=":", lw=0.9)
            a.annotate(f"s={m['new_s']}", (m["time"], 1.0), xycoords=("data", "axes fraction"),
                       rotation=90, va="top", ha="right", fontsize=7, color=line.get_color())
        b.hist([1e3 * x["step_time"] for x in r["_records"] if x.get("step_time")], bins=30,
               alpha=0.5, label=r["run"])
    if rows and rows[0]["target_loss"] is not None:
        a.axhline(rows[0]["target_loss"], color="gray", ls="--", lw=0.8, label="target")
    a.set_xlabel("wall time (s)")
    a.set_ylabel("training loss (messages used)")
    a.set_title("loss vs time")
    a.legend()
    b.set_xlabel("step time (ms)")
    b.set_ylabel("steps")
    b.set_title("step time distribution")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd report", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--target-loss", type=float, default=None)
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    if args.target_loss is not None and not math.isfinite(args.target_loss):
        p.error(f"--target-loss must be a finite loss, got {args.target_loss}")
    root = Path(args.run_dir)
    runs = find_runs(root)
    if not runs:
        print(f"pgc-hvd report: no records.jsonl in {root}, its sub-folders or {root / 'records'}")
        return 2
    try:
        rows = [summarize(r, args.target_loss) for r in runs]
    except (ValueError, OSError) as err:   # a damaged records file or summary.json, named
        p.error(str(err))
    text = table(rows) + switches_text(rows)
    print(text)
    (root / "report.md").write_text(text + "\n")
    if not args.no_plot:
        plot(rows, root / "report.png")
        print(f"plot: {root / 'report.png'}")
    return 0
