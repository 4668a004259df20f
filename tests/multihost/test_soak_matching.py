"""The matching of kills to the world changes the ranks recorded (pgc_hvd.metrics.world_changes;
the per-death and per-join figures of docs/elastic.md, "A repeated-kill soak", come from it)."""

from __future__ import annotations

from pgc_hvd.metrics.world_changes import match


def death(t, old_n=4, new_n=3, reform=0.3):
    return {"event": "world_change", "reason": "rank lost", "step": int(t), "old_n": old_n,
            "new_n": new_n, "joined": 0, "noticed_first_at": t + 0.05, "noticed_at": t + 0.06,
            "sync_started_at": t + 0.06 + reform, "ready_at": t + 0.1 + reform,
            "first_step_at": t + 0.2 + reform, "last_step_at": t - 0.02,
            "parameters_broadcast": False}


def join(t, old_n=3, new_n=4, joined=1):
    return {"event": "world_change", "reason": "hosts updated", "step": int(t), "old_n": old_n,
            "new_n": new_n, "joined": joined, "noticed_first_at": t, "noticed_at": t,
            "sync_started_at": t + 1.0, "ready_at": t + 1.3, "first_step_at": t + 1.4,
            "last_step_at": t - 0.03, "parameters_broadcast": True}


def test_each_kill_gets_its_death_and_join():
    kills = [{"kill": 0, "t_kill": 100.0, "t_add": 101.0, "added": "h5"},
             {"kill": 1, "t_kill": 120.0, "t_add": 121.0, "added": "h6"}]
    evs = [death(100.0), join(102.0), death(120.0, reform=0.5), join(123.0)]
    deaths, joins = match(kills, evs, [])
    assert [d["kill"] for d in deaths] == [0, 1]
    assert abs(deaths[0]["lost_s"] - 0.5) < 1e-9 and abs(deaths[1]["lost_s"] - 0.7) < 1e-9
    assert [(j["kill"], j["joined"]) for j in joins] == [(0, 1), (1, 1)]
    assert abs(joins[0]["lost_s"] - 1.43) < 1e-9 and abs(joins[0]["notice_s"] - 1.0) < 1e-9


def test_two_deaths_in_one_reform_serve_two_kills_and_a_restart_has_none():
    # kill 1 lands while the survivors of kill 0 still re-form: one record 4 -> 2;
    # kill 2's job was aborted by Horovod (no record): it gets none, not a later one
    kills = [{"kill": 0, "t_kill": 100.0}, {"kill": 1, "t_kill": 110.0},
             {"kill": 2, "t_kill": 130.0}, {"kill": 3, "t_kill": 200.0}]
    evs = [death(100.0, new_n=2, reform=15.0), death(200.0)]
    deaths, _ = match(kills, evs, [])
    assert [(d["kill"], d["new_n"]) for d in deaths] == [(0, 2), (1, 2), (3, 3)]


def test_a_join_whose_new_rank_died_has_no_lost_time():
    kills = [{"kill": 0, "t_kill": 100.0, "t_add": 101.0, "added": "h5"}]
    deaths, joins = match(kills, [death(100.0), join(103.0, old_n=3, new_n=3, joined=0)], [])
    assert len(deaths) == 1 and joins == [{**joins[0], "joined": 0}] and "lost_s" not in joins[0]
