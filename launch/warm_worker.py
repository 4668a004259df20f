"""Warm workers: a rank that joins an elastic job starts without importing torch (docs/elastic.md).

A joining rank's start-up is time the survivors wait: Horovod starts the new host's worker only
after every current worker has left its world, and the new world forms when that worker reaches
``hvd.init()`` and ``sync()``. Most of that start-up is the interpreter's imports (torch,
Horovod, pgc_hvd, and what torch imports lazily on first use, e.g. ``torch._dynamo`` when the
first optimizer is built): 2-6 s on a loaded 2-core machine. A warm-worker server per host does
those imports once, before the host is listed; the command horovodrun runs per slot is a small
client that hands the job to the server, which forks a child that runs the script.

On each host, before it is listed by the discovery script (same virtualenv, ``PYTHONPATH`` and
working directory as the job)::

    python launch/warm_worker.py serve --dir /tmp/pgc-warm &

and in the horovodrun command, ``python launch/warm_worker.py run --dir /tmp/pgc-warm --`` in
front of the script::

    horovodrun --gloo -np 4 --min-np 2 --max-np 4 --host-discovery-script ./discover.sh \\
        python launch/warm_worker.py run --dir /tmp/pgc-warm -- launch/elastic_train.py --out run/

The client (``run``) imports nothing beyond the standard library. It connects to the server's
unix socket ``DIR/sock-<HOROVOD_HOSTNAME>`` (``DIR/sock`` when the server was started without
``--host``; one folder per host on real nodes, one socket per loopback host on one machine),
sends its argv, environment and working directory and passes its stdin, stdout and stderr
(``SCM_RIGHTS``), so the child writes where a normal worker would. The child:

* is forked by the server (single-threaded: it starts no thread, so forking is safe), takes the
  client's descriptors, environment (``os.environ`` replaced: Horovod's ``HOROVOD_RANK``...),
  working directory and ``sys.argv``, puts the script's folder and the client's ``PYTHONPATH``
  first on ``sys.path``, and runs the script as ``__main__`` (``runpy``);
* registers itself as ``DIR/children/<pid>`` (its argv, NUL-separated) while it runs.

What Horovod sees is what it sees of a normal worker:

* the child's exit status is the client's: an exit code as is, a death by a signal as the
  client's own death by that signal (SIGKILL: -9, i.e. 137 through a shell);
* SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to the client (Horovod tearing
  down the ssh command) are forwarded to the child;
* the client's death (SIGKILL included) kills the child: the server sees the connection close
  and sends the child SIGKILL;
* the server's death ends the client with status 1 after it has sent the child SIGKILL.

Without a server to reach, the client runs the script itself (``exec`` of the interpreter, a
cold start), saying so on stderr; ``--require`` makes that an error (status 2) instead.

The server forks children from one interpreter state: a script that changes module-level state
of an imported library affects only its own child. Modules preloaded (``--preload``, default
torch, torch._dynamo, horovod.torch, pgc_hvd and its elastic runtime) are those the server
imports; each child imports the rest itself. The server must be restarted to pick up changed
code of a preloaded module.
"""

from __future__ import annotations

import argparse
import array
import json
import os
import select
import signal
import socket
import struct
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
DEFAULT_PRELOAD = ("torch,torch._dynamo,torch.optim,horovod.torch,pgc_hvd,"
                   "pgc_hvd.runtime.elastic.state,pgc_hvd.runtime.elastic.checkpoints")


def socket_path(folder: str, host: str | None) -> str:
    return os.path.join(folder, f"sock-{host}" if host else "sock")


# -- framing: 4-byte length + payload -------------------------------------------------------
def send_msg(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    head = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [head + data], fds)
    else:
        sock.sendall(head + data)


def recv_exact(sock: socket.socket, n: int, fds: list | None = None) -> bytes:
    buf = b""
    while len(buf) < n:
        if fds is not None and not buf:
            chunk, got, _, _ = socket.recv_fds(sock, n - len(buf), 8)
            fds.extend(got)
        else:
            chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def recv_msg(sock: socket.socket, fds: list | None = None) -> dict:
    (n,) = struct.unpack("!I", recv_exact(sock, 4, fds))
    return json.loads(recv_exact(sock, n))


# -- the client ----------------------------------------------------------------------------
def client(folder: str, argv: list[str], require: bool = False) -> int:
    if not argv:
        print("warm_worker run: no script given (run --dir DIR -- SCRIPT ARGS...)",
              file=sys.stderr)
        return 2
    path = socket_path(folder, os.environ.get("HOROVOD_HOSTNAME"))
    if not os.path.exists(path):
        path = socket_path(folder, None) if os.path.exists(socket_path(folder, None)) else path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        sock.close()
        if require:
            print(f"warm_worker run: no server at {path} ({err}); start one on this host "
                  f"(python launch/warm_worker.py serve --dir {folder}) or drop --require",
                  file=sys.stderr)
            return 2
        print(f"warm_worker run: no server at {path} ({err}); starting {argv[0]} cold",
              file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, *argv])
    env = dict(os.environ)
    send_msg(sock, {"argv": argv, "env": env, "cwd": os.getcwd()}, [0, 1, 2])
    child = [None]

    def forward(sig, _frame):
        if child[0] is not None:
            try:
                os.kill(child[0], sig)
            except ProcessLookupError:
                pass

    for s in FORWARDED:
        signal.signal(s, forward)
    while True:
        try:
            msg = recv_msg(sock)
        except (EOFError, ConnectionError):
            if child[0] is not None:
                try:
                    os.kill(child[0], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            print(f"warm_worker run: the server at {path} went away", file=sys.stderr)
            return 1
        if "pid" in msg:
            child[0] = msg["pid"]
        elif "error" in msg:
            print(f"warm_worker run: {msg['error']}", file=sys.stderr)
            return 2
        elif "status" in msg:
            status = msg["status"]
            if os.WIFSIGNALED(status):   # die the same way (Horovod sees -sig)
                sig = os.WTERMSIG(status)
                for s in FORWARDED:
                    signal.signal(s, signal.SIG_DFL)
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
                time.sleep(1)
                return 128 + sig
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


# -- the server ----------------------------------------------------------------------------
def run_child(msg: dict, fds: list[int], folder: str, close: list) -> None:
    """In the forked child: become the client's worker and run its script; never returns."""
    code = 1
    try:
        for s in close:
            s.close()
        for s in FORWARDED + (signal.SIGCHLD,):   # as in a fresh interpreter
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT
                          else signal.SIG_DFL)
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(msg["cwd"])
        os.environ.clear()
        os.environ.update(msg["env"])
        os.environ["PGC_WARM_WORKER"] = "1"
        argv = msg["argv"]
        script = os.path.abspath(argv[0])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [os.path.dirname(script)] + [p for p in extra if p not in sys.path]
        sys.argv = [script, *argv[1:]]
        with open(os.path.join(folder, "children", str(os.getpid())), "w") as f:
            f.write("\0".join([script, *argv[1:]]))
        cascade = sys.modules.get("pgc_hvd.runtime.elastic.cascade")
        if cascade is not None:   # its import-time mark holds the server's sockets
            cascade.SOCKETS.mark()
        import runpy
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(code)


def warm_torch() -> None:
    """What torch imports lazily on first use, done once here (no thread starts): building an
    optimizer imports ``torch._dynamo`` (1.5 s unloaded), the first ``torch.save`` /
    ``torch.load(weights_only=True)`` (a checkpoint, an elastic broadcast) their helpers."""
    import io

    import torch
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(2)}, "opt": opt.state_dict(), "v": 1}, buf)
    buf.seek(0)
    torch.load(buf, weights_only=True)


def serve(folder: str, host: str | None, preload: str) -> int:
    t0 = time.time()
    for name in [m for m in preload.split(",") if m]:
        __import__(name)
    if "torch" in sys.modules:
        warm_torch()
    os.makedirs(os.path.join(folder, "children"), exist_ok=True)
    path = socket_path(folder, host)
    if os.path.exists(path):
        os.unlink(path)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path + ".tmp")
    os.replace(path + ".tmp", path)
    lsock.listen(64)
    stop = [False]

    def on_term(*_):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"warm_worker serve: ready at {path} after {time.time() - t0:.1f} s "
          f"(pid {os.getpid()})", flush=True)
    conns: dict[socket.socket, int] = {}   # client connection -> its child's pid
    by_pid: dict[int, socket.socket] = {}
    try:
        while not stop[0]:
            try:
                ready, _, _ = select.select([lsock, *conns], [], [], 0.05)
            except InterruptedError:
                ready = []
            for s in ready:
                if s is lsock:
                    conn, _ = lsock.accept()
                    fds: list[int] = []
                    try:
                        msg = recv_msg(conn, fds)
                    except (EOFError, OSError, ValueError):
                        conn.close()
                        for fd in fds:
                            os.close(fd)
                        continue
                    if len(fds) < 3 or not msg.get("argv"):
                        send_msg(conn, {"error": "need argv and 3 descriptors"})
                        conn.close()
                        for fd in fds:   # the refused request's descriptors are not kept
                            os.close(fd)
                        continue
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        run_child(msg, fds, folder, [lsock, conn, *conns])
                    for fd in fds:
                        os.close(fd)
                    conns[conn], by_pid[pid] = pid, conn
                    send_msg(conn, {"pid": pid})
                else:   # a client's connection: readable only when it closed (died)
                    try:
                        gone = s.recv(1) == b""
                    except OSError:
                        gone = True
                    if gone:
                        try:
                            os.kill(conns[s], signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                        s.close()
                        del conns[s]
            while by_pid:   # reap: each child's status to its client
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = by_pid.pop(pid, None)
                try:
                    os.unlink(os.path.join(folder, "children", str(pid)))
                except OSError:
                    pass
                if conn is not None and conn in conns:
                    try:
                        send_msg(conn, {"status": status})
                    except OSError:
                        pass
                    conn.close()
                    del conns[conn]
    finally:
        for conn, pid in conns.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            conn.close()
        lsock.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    return 0


class LocalWarmServers:
    """One warm-worker server per loopback host of a ``LocalHosts`` (benchmarks, tests): all
    on this machine, each with its own socket in ``folder``. ``command(script)`` is the
    horovodrun command's script part; ``ensure(hosts)`` starts the servers not yet running
    and waits until they are ready; ``stop()`` ends them."""

    def __init__(self, lh, folder, env: dict | None = None, preload: str = DEFAULT_PRELOAD,
                 timeout: float = 120.0):
        import subprocess
        self._subprocess = subprocess
        self.folder = str(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        self.preload, self.timeout = preload, timeout
        self.procs: dict[str, object] = {}

    def command(self, script: str) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), "run", "--dir", self.folder, "--",
                script]

    def ensure(self, hosts) -> None:
        started = []
        for h in hosts:
            if h in self.procs and self.procs[h].poll() is None:
                continue
            log = open(os.path.join(self.folder, f"serve-{h}.log"), "w")
            self.procs[h] = self._subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "serve", "--dir", self.folder,
                 "--host", h, "--preload", self.preload], env=self.env, stdout=log,
                stderr=self._subprocess.STDOUT, start_new_session=True)
            started.append(h)
        deadline = time.monotonic() + self.timeout
        for h in started:
            while not os.path.exists(socket_path(self.folder, h)):
                if self.procs[h].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the warm-worker server of {h} did not start: "
                                       + open(os.path.join(self.folder, f"serve-{h}.log"))
                                       .read()[-2000:])
                time.sleep(0.05)

    def stop(self, hosts=None) -> None:
        for h in list(self.procs if hosts is None else hosts):
            p = self.procs.pop(h, None)
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except self._subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script = []
    if "--" in argv:
        i = argv.index("--")
        argv, script = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="preload and serve this host's workers")
    s.add_argument("--dir", required=True, help="folder of the socket and the children list")
    s.add_argument("--host", default=None, help="serve DIR/sock-HOST (the HOROVOD_HOSTNAME of "
                                                "the workers it serves; default DIR/sock)")
    s.add_argument("--preload", default=DEFAULT_PRELOAD, help="modules to import, comma-separated")
    r = sub.add_parser("run", help="run SCRIPT ARGS through this host's server: run --dir DIR "
                                   "-- SCRIPT ARGS")
    r.add_argument("--dir", required=True)
    r.add_argument("--require", action="store_true",
                   help="fail (status 2) instead of starting cold when no server answers")
    args = p.parse_args(argv)
    if args.cmd == "serve":
        return serve(args.dir, args.host, args.preload)
    return client(args.dir, script, args.require)


if __name__ == "__main__":
    sys.exit(main())
