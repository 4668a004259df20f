"""launch/warm_worker.py: a worker started through a warm server behaves, for whoever started
it, as the script started directly: its exit status (a signal death included), forwarded
signals, stdio, environment, working directory; the client's death kills the child, the
server's death ends the client; without a server it starts cold. Real processes throughout
(a server that preloads only ``json``, so each test takes about a second), and one horovodrun
job of 2 ranks on loopback ssh hosts through warm servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_watch import run_watched

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WARM = ROOT / "launch" / "warm_worker.py"
sys.path.insert(0, str(ROOT / "launch"))

SCRIPT = """\
import os, signal, sys, time
print("out", sys.argv[1:], os.environ.get("WW_FOO"), os.getcwd(),
      os.environ.get("PGC_WARM_WORKER"), flush=True)
print("err", file=sys.stderr, flush=True)
mode = sys.argv[1]
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "stdin":
    print("got", sys.stdin.readline().strip(), flush=True)
if mode == "raise":
    raise ValueError("boom")
if mode == "selfkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "wait":
    def on(sig, _):
        print("caught", sig, flush=True)
        sys.exit(40 + sig)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on)
    with open(sys.argv[2], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "warm"
    proc = subprocess.Popen([sys.executable, str(WARM), "serve", "--dir", str(folder),
                             "--preload", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not (folder / "sock").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.02)
    (tmp_path / "t.py").write_text(SCRIPT)
    yield folder, proc
    if proc.poll() is None:
        proc.terminate()
        proc.wait(10)


def client(folder, *args, **kw):
    return [sys.executable, str(WARM), "run", "--dir", str(folder), *kw.get("opts", []), "--",
            "t.py", *args]


def test_exit_status_stdio_env_cwd(server, tmp_path):
    folder, _ = server
    got = subprocess.run(client(folder, "exit", "3"), cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "WW_FOO": "bar"}, timeout=30)
    assert got.returncode == 3
    assert got.stdout == f"out ['exit', '3'] bar {tmp_path} 1\n"
    assert got.stderr == "err\n"
    got = subprocess.run(client(folder, "stdin"), cwd=tmp_path, input="a line\n",
                         capture_output=True, text=True, timeout=30)
    assert got.returncode == 0 and "got a line" in got.stdout
    got = subprocess.run(client(folder, "raise"), cwd=tmp_path, capture_output=True, text=True,
                         timeout=30)
    assert got.returncode == 1 and "ValueError: boom" in got.stderr


def test_child_killed_by_a_signal_kills_the_client_alike(server, tmp_path):
    folder, _ = server
    got = subprocess.run(client(folder, "selfkill"), cwd=tmp_path, capture_output=True,
                         timeout=30)
    assert got.returncode == -signal.SIGKILL
    got = subprocess.run(" ".join(client(folder, "selfkill")), shell=True, cwd=tmp_path,
                         capture_output=True, timeout=30)
    assert got.returncode == 128 + signal.SIGKILL   # what a shell (ssh's command) reports


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signals_reach_the_child(server, tmp_path, sig):
    folder, _ = server
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen(client(folder, "wait", str(pidfile)), cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert child != proc.pid and (folder / "children" / str(child)).exists()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 40 + sig and f"caught {sig}" in out
    deadline = time.monotonic() + 10
    while (folder / "children" / str(child)).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not (folder / "children" / str(child)).exists()


def test_client_death_kills_the_child_and_server_death_ends_the_client(server, tmp_path):
    folder, srv = server
    for victim in ("client", "server"):
        pidfile = tmp_path / f"pid-{victim}"
        proc = subprocess.Popen(client(folder, "wait", str(pidfile)), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        child = int(pidfile.read_text())
        (proc if victim == "client" else srv).send_signal(
            signal.SIGKILL if victim == "client" else signal.SIGTERM)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(child), f"the child outlived the {victim}"
        rc = proc.wait(10)
        if victim == "client":
            assert rc == -signal.SIGKILL
        else:
            assert rc == 1 and "went away" in proc.stderr.read()


def test_without_a_server_cold_or_refused(tmp_path):
    (tmp_path / "t.py").write_text(SCRIPT)
    got = subprocess.run(client(tmp_path / "none", "exit", "4"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 4 and "starting t.py cold" in got.stderr
    assert "out ['exit', '4'] None" in got.stdout and got.stdout.strip().endswith("None")
    got = subprocess.run(client(tmp_path / "none", "exit", "4", opts=["--require"]),
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert got.returncode == 2 and "start one on this host" in got.stderr


@pytest.mark.multirank
def test_horovodrun_ranks_through_warm_servers(tmp_path, two_hosts):
    from warm_worker import LocalWarmServers
    exe, lh = two_hosts
    env = lh.elastic_env(30, str(ROOT))
    warm = LocalWarmServers(lh, tmp_path / "warm", env=env, preload="torch,horovod.torch")
    try:
        warm.ensure(lh.hosts)
        cmd = [str(exe), "--gloo", "-np", "2", "-H", lh.spec(1), *lh.horovodrun_args(),
               *warm.command(str(HERE / "scripts" / "warm_checks.py"))]
        proc = run_watched(cmd, env=env, cwd=tmp_path, timeout=240)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        lines = sorted(x.split("]<stdout>:", 1)[-1] for x in proc.stdout.splitlines()
                       if "WARM rank=" in x)
        assert lines == [f"WARM rank={r} size=2 warm=1 host={h} ok"
                         for r, h in enumerate(lh.hosts)], proc.stdout
    finally:
        warm.stop()
