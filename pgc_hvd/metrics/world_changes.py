"""Elastic world changes matched to the kills that caused them: the per-death and per-join
figures of a repeated-kill soak (benchmarks/elastic/elastic_soak.py; docs/elastic.md, "A
repeated-kill soak"), from the ``world_change`` records the elastic runtime writes and the
``startup`` records of its processes. Pure functions over those records.

May import: the standard library.
"""

from __future__ import annotations


def startup_split(s: dict, t_launch: float | None = None) -> dict:
    """Seconds per start-up phase of one process (its ``OUT/startup`` record)."""
    d = {"exec_to_script": s["script"] - s["process_started"],
         "imports": s["imported"] - s["script"],
         "to_init": s["init_entered"] - s["imported"],
         "hvd_init": s["init_done"] - s["init_entered"],
         "build": s["built"] - s["init_done"],
         "sync_and_first_step": s["first_step"] - s["built"],
         "total": s["first_step"] - s["process_started"]}
    if t_launch is not None:
        d = {"launch_to_process": s["process_started"] - t_launch, **d,
             "launch_to_first_step": s["first_step"] - t_launch}
    return {k: round(v, 3) for k, v in d.items()}


MATCH_S = 30.0   # a death's or a join's record later than this is not its own (a restart)


def match(kills: list[dict], evs: list[dict], sts: list[dict]) -> tuple[list, list]:
    """Each kill's death record and its replacement's join record. A death's record is the
    first ``rank lost`` world change the survivors noticed within ``MATCH_S`` after the kill
    and before the next kill;
    one record of ``old_n - new_n`` = k deaths serves k kills (a second kill that landed while
    the survivors of the first were still re-forming). A join's record is the first ``hosts
    updated`` change the ranks acted on within ``MATCH_S`` after the listing was written; one
    with ``joined`` = k serves k replacements (``joined`` 0: the new rank died before the
    world re-formed; no ``lost_s``). A kill whose job Horovod aborted has no record: the
    supervisor's restart is counted apart."""
    left = {i: (max(1, e["old_n"] - e["new_n"]) if e.get("reason") == "rank lost"
                else max(1, e.get("joined") or 0)) for i, e in enumerate(evs)}

    def first(pred):
        for i, e in enumerate(evs):
            if left[i] > 0 and e.get("first_step_at") and pred(e):
                left[i] -= 1
                return e
        return None

    deaths, joins = [], []
    for i, rec in enumerate(kills):
        t_next = kills[i + 1]["t_kill"] if i + 1 < len(kills) else float("inf")
        d = first(lambda e: e.get("reason") == "rank lost" and e.get("noticed_first_at")
                  and e["noticed_first_at"] - rec["t_kill"] <= MATCH_S
                  and (rec["t_kill"] - 0.5 <= e["noticed_first_at"] < t_next - 0.5   # its death
                       or rec["t_kill"] <= e["sync_started_at"]))     # one more, re-forming
        if d is not None:
            deaths.append({"kill": rec["kill"], "step": d["step"], "old_n": d["old_n"],
                           "new_n": d["new_n"], "lost_s": d["first_step_at"] - rec["t_kill"],
                           "detect_s": max(0.0, d["noticed_at"] - rec["t_kill"]),
                           "reform_s": d["sync_started_at"] - d["noticed_at"],
                           "rebuild_s": d["ready_at"] - d["sync_started_at"],
                           "first_step_s": d["first_step_at"] - d["ready_at"]})
    for rec in kills:
        if "t_add" not in rec:
            continue
        j = first(lambda e: e.get("reason") == "hosts updated" and e.get("noticed_at")
                  and 0 <= e["noticed_at"] - rec["t_add"] <= MATCH_S)
        if j is None:
            continue
        row = {"kill": rec["kill"], "host": rec["added"], "step": j["step"],
               "old_n": j["old_n"], "new_n": j["new_n"], "joined": j["joined"],
               "notice_s": j["noticed_at"] - rec["t_add"],
               "parameters_broadcast": j["parameters_broadcast"]}
        if j["joined"]:
            row.update(lost_s=j["first_step_at"] - j["last_step_at"],
                       reform_s=j["sync_started_at"] - j["noticed_at"],
                       sync_s=j["ready_at"] - j["sync_started_at"],
                       first_step_s=j["first_step_at"] - j["ready_at"])
            s = next((s for s in sts if s["host"] == rec["added"]
                      and abs(s["first_step"] - j["first_step_at"]) < 1.0), None)
            if s is not None:
                row.update(closed_to_process_s=s["process_started"] - j["noticed_at"],
                           new_rank=startup_split(s))
        joins.append(row)
    return deaths, joins
