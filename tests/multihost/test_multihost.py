"""horovodrun across hosts it must reach over ssh, and elastic continuation, on one machine.

The module's fixture (:class:`launch/local_hosts.LocalHosts`) starts an sshd on 127.0.0.2,
127.0.0.3, ... (addresses horovodrun does not count as local, so it sshes to them as to real
nodes) with a key it generates, installing openssh-server first when it is missing and this is
root; it skips the tests with the reason when that cannot be had, and stops the sshd after.

* multi-host: ``horovodrun --gloo -np 4 -H 127.0.0.2:2,127.0.0.3:2`` (a ``--hostfile`` of the
  same hosts is checked by Horovod's parser, without a launch: test_elastic_units.py) with
  pgc-cr: 4 ranks on 2 hosts, local ranks 0-1 on each, identical parameters, logins seen by sshd.
* elastic: ``horovodrun --gloo -np 4 --min-np 3 --host-discovery-script`` with each rank its own
  host; the rank on 127.0.0.4 SIGKILLs itself at version 20; the other three leave the broken
  world at once (pgc_hvd.runtime.elastic.cascade: the gloo timeout is 30 s, every survivor must
  have noticed within 10 s), re-form a world of 3, rebuild the scheme (pgc_hvd.runtime.elastic)
  and reach the last version with identical parameters; the world change is recorded. And a
  rank that joins (a host added to discovery).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from launch_watch import run_watched

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "launch"))
from local_hosts import LocalHosts, Unavailable  # noqa: E402

CHECKS = HERE / "scripts" / "multihost_checks.py"
ELASTIC = ROOT / "launch" / "elastic_train.py"


def _horovodrun() -> str:
    exe = Path(sys.executable).with_name("horovodrun")
    if not exe.exists():
        pytest.skip("horovod is not installed (run bash launch/setup.sh)")
    return str(exe)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    lh = LocalHosts(count=5)
    try:
        lh.start()
    except Unavailable as err:
        pytest.skip(f"no local ssh hosts: {err}")
    yield lh
    lh.stop()


def _run(lh, args, cwd, timeout, env_extra=None):
    env = lh.env()
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(env_extra or {})
    cmd = [_horovodrun(), "--gloo", *args]
    proc = run_watched(cmd, env=env, cwd=cwd, timeout=timeout)
    return proc, " ".join(cmd)


def _mh_lines(out):
    rows = []
    for line in out.splitlines():
        if "MH rank=" in line:
            rows.append(dict(kv.split("=", 1) for kv in line.split("MH ", 1)[1].split()))
    return rows


@pytest.mark.multirank
def test_multihost_pgc_cr_np4_two_hosts(hosts, tmp_path):
    """(``--hostfile`` names the same hosts: Horovod's parser reads the recipe's file as this
    ``-H`` spec, tests/multihost/test_elastic_units.py.)"""
    before = hosts.accepted_logins()
    where = ["-H", hosts.spec(2, count=2)]
    proc, cmd = _run(hosts, ["-np", "4", *where, *hosts.horovodrun_args(), sys.executable,
                             str(CHECKS), "--steps", "30"], tmp_path, timeout=150)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rows = _mh_lines(proc.stdout)
    assert sorted(int(r["rank"]) for r in rows) == [0, 1, 2, 3], proc.stdout[-3000:]
    assert {r["size"] for r in rows} == {"4"}
    by_host = {}
    for r in rows:
        by_host.setdefault(r["host"], []).append(int(r["local_rank"]))
    assert {h: sorted(v) for h, v in by_host.items()} == {hosts.hosts[0]: [0, 1],
                                                          hosts.hosts[1]: [0, 1]}
    assert len({r["digest"] for r in rows}) == 1, rows
    assert {r["version"] for r in rows} == {"30"}
    # horovodrun really went through ssh: the 4 workers' logins (plus its checks) reached sshd
    assert hosts.accepted_logins() - before >= 4


def _results(out):
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    events = [json.loads(l) for l in (out / "elastic.jsonl").read_text().splitlines()] \
        if (out / "elastic.jsonl").exists() else []
    return rows, events


@pytest.mark.multirank
@pytest.mark.parametrize("victim_host", [2, 0], ids=["rank2", "rank0"])
def test_elastic_kill_one_of_four_trains_on_with_three(hosts, tmp_path, victim_host):
    """Kill (SIGKILL) the rank on the third host (or the first: rank 0, the control log's
    decider and the server of its store) at version 20 of 60: three ranks finish, on the
    default control plane. The gloo timeout is 30 s; without the cascade most such kills leave
    a survivor waiting for it (docs/elastic.md section 3), with it every survivor notices within
    a fraction of a second (bound here: 10 s, for a loaded machine); a dead rank 0 is noticed
    by its store's reset connection as fast."""
    _, script = hosts.discovery(tmp_path, hosts.hosts[:4])
    out = tmp_path / "run"
    victim = hosts.hosts[victim_host]
    proc, cmd = _run(hosts, ["-np", "4", "--min-np", "3", "--max-np", "4",
                             "--host-discovery-script", str(script), *hosts.horovodrun_args(),
                             sys.executable, str(ELASTIC), "--steps", "60", "--out", str(out),
                             "--kill-host", victim, "--kill-at", "20"],
                     tmp_path, timeout=170, env_extra={"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"})
    tail = f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, tail
    kill = json.loads((out / "kill.json").read_text())
    assert kill["host"] == victim and kill["version"] == 20
    rows, events = _results(out)
    assert len(rows) == 3 and victim not in {r["host"] for r in rows}, tail
    assert {r["n"] for r in rows} == {3} and {r["version"] for r in rows} == {60}, rows
    assert len({r["digest"] for r in rows}) == 1, [r["digest"] for r in rows]
    assert {r["worlds"] for r in rows} == {2}
    assert len(events) == 1, events
    ev = events[0]
    assert (ev["old_n"], ev["new_n"], ev["reason"], ev["joined"]) == (4, 3, "rank lost", 0), ev
    assert 20 <= ev["step"] <= 21, ev      # the version the survivors held: nothing rolled back
    assert not ev["parameters_broadcast"], ev   # the survivors already held the same model
    # every survivor left the broken world long before gloo's 30 s timeout could expire
    assert ev["noticed_at"] - kill["time"] < 10, f"{ev}\n{tail}"
    assert 0 < ev["seconds_lost"] < 20, ev
    for r in rows:
        assert [c["step"] for c in r["changes"]] == [ev["step"]]
        ns = [n for _, _, n in r["step_times"]]
        assert ns[0] == 4 and ns[-1] == 3 and ns == sorted(ns, reverse=True)


@pytest.mark.multirank
def test_elastic_auto_s_replans_for_the_new_world(hosts, tmp_path):
    """``stragglers="auto"`` across a re-form: the rank on the second host is slow in every
    world; the rule raises s 0 -> 1 in the world of 4, the rank on the fourth host is killed,
    and the world of 3 starts a fresh rule for n = 3 (s back at its start, 0) that raises s
    again; the three survivors reach the last version with identical parameters and saw the
    same s at the same versions."""
    _, script = hosts.discovery(tmp_path, hosts.hosts[:4])
    out = tmp_path / "run"
    proc, cmd = _run(hosts, ["-np", "4", "--min-np", "3", "--max-np", "4",
                             "--host-discovery-script", str(script), *hosts.horovodrun_args(),
                             sys.executable, str(ELASTIC), "--steps", "50", "--out", str(out),
                             "--stragglers", "auto", "--auto-options",
                             "s_start=0,s_max=1,first=4,every=4,cooldown=4,window=6",
                             "--slow-host", hosts.hosts[1], "--slow", "0.2",
                             "--compute-time", "0.01", "--kill-host", hosts.hosts[3],
                             "--kill-at", "20"],
                     tmp_path, timeout=200, env_extra={"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"})
    tail = f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, tail
    rows, events = _results(out)
    assert len(rows) == 3 and {r["n"] for r in rows} == {3}, tail
    assert {r["version"] for r in rows} == {50}, rows
    assert len({r["digest"] for r in rows}) == 1, [r["digest"] for r in rows]
    assert len(events) == 1 and events[0]["new_n"] == 3, events
    kill = json.loads((out / "kill.json").read_text())
    # the re-planned agent keeps elastic mode's fault handling: no census, leave at once
    assert events[0]["noticed_at"] - kill["time"] < 10, events
    seen = [r["s_seen"] for r in rows]
    assert all(x == seen[0] for x in seen), seen          # every rank, the same s at each version
    by_world = {}
    for world, version, s in seen[0]:
        by_world.setdefault(world, []).append((version, s))
    assert set(by_world) == {1, 2}, seen[0]
    for world, changes in by_world.items():
        # each world starts its own rule at s_start = 0 and raises s to 1 for the slow host
        assert changes[0][1] == 0 and changes[-1][1] == 1, (world, changes)
    assert by_world[2][0][0] >= events[0]["step"], (by_world, events)


@pytest.mark.multirank
def test_elastic_rank_joins(hosts, tmp_path):
    """Start with 3 ranks; at version 20 rank 0 adds a fourth host to the discovery listing:
    the ranks agree at a check (every 10 versions), close, and a world of 4 goes on; the new
    rank gets the model by broadcast and ends with the same parameters. (Training runs past
    version 60 until the world has 4 ranks, at most 2000 versions, so a slow notice from
    Horovod's driver cannot end the run first.)"""
    listing, script = hosts.discovery(tmp_path, hosts.hosts[:3])
    out = tmp_path / "run"
    newcomer = hosts.hosts[3]
    proc, cmd = _run(hosts, ["-np", "3", "--min-np", "3", "--max-np", "4",
                             "--host-discovery-script", str(script), *hosts.horovodrun_args(),
                             sys.executable, str(ELASTIC), "--steps", "60", "--out", str(out),
                             "--until-n", "4", "--max-steps", "2000",
                             "--compute-time", "0.01", "--add-host", f"{newcomer}:1",
                             "--add-at", "20", "--hosts-file", str(listing)],
                     tmp_path, timeout=170, env_extra={"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"})
    tail = f"{cmd}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, tail
    rows, events = _results(out)
    assert len(rows) == 4, tail
    assert {r["n"] for r in rows} == {4}, rows
    assert len({r["version"] for r in rows}) == 1 and rows[0]["version"] >= 60, rows
    assert rows[0]["version"] < 2000, "the join never happened"
    assert len({r["digest"] for r in rows}) == 1, [r["digest"] for r in rows]
    assert len(events) == 1, events
    ev = events[0]
    assert (ev["old_n"], ev["new_n"], ev["reason"], ev["joined"]) == (3, 4, "hosts updated", 1)
    assert ev["parameters_broadcast"] and ev["step"] % 10 == 0 and ev["step"] >= 30, ev
    joiner = [r for r in rows if r["host"] == newcomer]
    assert len(joiner) == 1 and joiner[0]["worlds"] == 1
    assert joiner[0]["step_times"][0][0] == ev["step"] + 1
