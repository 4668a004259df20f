"""Several "remote" hosts on one machine: an sshd on loopback addresses 127.0.0.2, 127.0.0.3, ...

horovodrun treats a host as local only when its address is one of the machine's interface
addresses (``horovod.runner.util.network.get_local_host_addresses``: 127.0.0.1 and the NICs'
addresses); 127.0.0.2 and up route to the loopback device but are not interface addresses, so
horovodrun reaches them over ssh, exactly as it reaches real nodes: ``-H 127.0.0.2:2,127.0.0.3:2``
or a hostfile, ``-p PORT -i KEY``, and ``--network-interface lo`` so that gloo stays on the
loopback interface (:meth:`LocalHosts.horovodrun_args` gives all three). :class:`LocalHosts`
starts what that needs and removes it again: a host key and a client key it generates, an sshd
(``sshd -D``, its own config, listening on those addresses only, on a free port), and a folder
with an ``ssh`` wrapper put first on PATH that adds ``-F none`` and a private known-hosts file
(so that nothing in ``~/.ssh`` is read or written). sshd is installed with ``apt-get install
openssh-server`` when it is missing and this process is root; when that cannot be had,
:class:`Unavailable` says why.

    with LocalHosts(count=2) as lh:
        subprocess.run(["horovodrun", "--gloo", "-np", "4", "-H", lh.spec(2), *lh.horovodrun_args(),
                        "python", "train.py"], env=lh.env())

    python launch/local_hosts.py 4      # start, print the horovodrun arguments, wait for Ctrl-C
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional


class Unavailable(RuntimeError):
    """A prerequisite of the local hosts cannot be had (the message says which and why)."""


def _run(cmd, timeout=600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def find_sshd() -> Optional[str]:
    for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd", shutil.which("sshd") or ""):
        if p and os.access(p, os.X_OK):
            return p
    return None


def install_openssh(log=None) -> None:
    """``apt-get install -y openssh-server openssh-client`` (after ``apt-get update`` when the
    first try fails); raises :class:`Unavailable` when that is not possible."""
    if os.name != "posix" or os.geteuid() != 0:
        raise Unavailable("sshd is not installed and this process is not root, so it cannot "
                          "install it: install openssh-server (apt-get install openssh-server)")
    if shutil.which("apt-get") is None:
        raise Unavailable("sshd is not installed and there is no apt-get to install it: install "
                          "OpenSSH's server (sshd)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    pkgs = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "openssh-server",
            "openssh-client"]
    got = _run(pkgs, env=env)
    if got.returncode != 0:
        upd = _run(["apt-get", "update", "-q"], env=env)
        got = _run(pkgs, env=env)
        if got.returncode != 0:
            tail = (upd.stderr + got.stderr).strip().splitlines()[-3:]
            raise Unavailable("sshd is not installed and `apt-get install openssh-server` "
                              "failed: " + " | ".join(tail))
    if find_sshd() is None:
        raise Unavailable("apt-get installed openssh-server but no sshd binary was found")


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class LocalHosts:
    """``count`` hosts ``127.0.0.{first}`` .. that horovodrun reaches over ssh (module doc)."""

    def __init__(self, count: int = 4, first: int = 2, workdir: Optional[str] = None,
                 install: bool = True):
        if not (count >= 1 and first >= 2 and first + count <= 255):
            raise ValueError(f"count={count}, first={first}: addresses out of 127.0.0.2-254")
        self.hosts = [f"127.0.0.{first + i}" for i in range(count)]
        self.install = install
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="pgc-local-hosts-"))
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0

    # -- set-up --------------------------------------------------------------------
    def start(self) -> "LocalHosts":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        sshd = find_sshd()
        if sshd is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
            if not self.install:
                raise Unavailable("sshd/ssh/ssh-keygen not installed (install openssh-server)")
            install_openssh()
            sshd = find_sshd()
        for h in self.hosts:
            try:
                with socket.socket() as sock:
                    sock.bind((h, 0))
            except OSError as err:
                raise Unavailable(f"cannot bind loopback address {h} ({err}): this kernel routes "
                                  f"only 127.0.0.1 to lo") from None
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "client_key"):
            if not (d / key).exists():
                got = _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)],
                           timeout=60)
                if got.returncode != 0:
                    raise Unavailable(f"ssh-keygen failed: {got.stderr.strip()}")
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        os.chmod(d / "authorized_keys", 0o600)
        self.port = _free_port(self.hosts[0])
        listen = "\n".join(f"ListenAddress {h}:{self.port}" for h in self.hosts)
        (d / "sshd_config").write_text(
            f"{listen}\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPrintMotd no\n"
            f"PidFile {d / 'sshd.pid'}\nLogLevel INFO\nMaxStartups 64:30:128\nMaxSessions 64\n")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)   # sshd's privilege separation folder
        bindir = d / "bin"
        bindir.mkdir(exist_ok=True)
        real_ssh = shutil.which("ssh")
        wrapper = bindir / "ssh"
        wrapper.write_text(
            "#!/bin/sh\n# horovodrun's ssh, with this folder's known-hosts file and no user config\n"
            f"exec {real_ssh} -F none -o UserKnownHostsFile={d / 'known_hosts'} "
            "-o LogLevel=ERROR -o BatchMode=yes \"$@\"\n")
        wrapper.chmod(0o755)
        self.log = d / "sshd.log"
        self.proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        pending = list(self.hosts)
        while pending:
            if self.proc.poll() is not None:
                raise Unavailable(f"sshd exited with status {self.proc.returncode}: "
                                  f"{self.log.read_text().strip()[-400:]}")
            got = _run([str(wrapper), "-o", "StrictHostKeyChecking=no", "-o", "ConnectTimeout=5",
                        "-i", str(d / "client_key"), "-p", str(self.port), pending[0], "true"],
                       timeout=30)
            if got.returncode == 0:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise Unavailable(f"ssh to {pending[0]}:{self.port} fails: "
                                  f"{got.stderr.strip()[-300:]}; sshd log: "
                                  f"{self.log.read_text().strip()[-300:]}")
            time.sleep(0.2)

    # -- use -----------------------------------------------------------------------
    def spec(self, slots: int = 1, count: Optional[int] = None) -> str:
        """``-H`` value: ``127.0.0.2:S,127.0.0.3:S,...`` for the first ``count`` hosts."""
        return ",".join(f"{h}:{slots}" for h in self.hosts[:count or len(self.hosts)])

    def hostfile(self, path, slots: int = 1, count: Optional[int] = None) -> str:
        """Write a ``--hostfile`` (``HOST slots=S`` lines) and return its path."""
        Path(path).write_text("".join(f"{h} slots={slots}\n"
                                      for h in self.hosts[:count or len(self.hosts)]))
        return str(path)

    def horovodrun_args(self) -> list:
        """``-p PORT -i KEY --network-interface lo``: sshd's port and the client key, and gloo
        pinned to the loopback interface. These hosts are all this machine, so their traffic
        belongs on ``lo``; without the pin horovodrun probes the hosts' common interfaces and
        takes the first of a set (``{lo, eth0}`` here), which is ``eth0`` in about half the
        runs (it depends on the string hash seed): the ranks then talk over the machine's
        network address (tests/multihost/test_loopback_hosts.py)."""
        return ["-p", str(self.port), "-i", str(self.dir / "client_key"),
                "--network-interface", "lo"]

    def env(self, base: Optional[dict] = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return env

    def discovery(self, folder, hosts: Optional[list] = None) -> tuple[Path, Path]:
        """In ``folder``: ``hosts.txt`` listing ``hosts`` (default all), one ``HOST:1`` a line,
        and ``discover.sh`` printing it, for ``--host-discovery-script``. Appending a line to the
        listing adds a host to the running job. Returns (listing, script)."""
        folder = Path(folder)
        listing, script = folder / "hosts.txt", folder / "discover.sh"
        listing.write_text("".join(f"{h}:1\n" for h in (self.hosts if hosts is None else hosts)))
        script.write_text(f"#!/bin/sh\ncat {listing}\n")
        script.chmod(0o755)
        return listing, script

    def elastic_env(self, gloo_timeout: float, pythonpath: str) -> dict:
        """:meth:`env` for an elastic job: one thread per rank, ``HOROVOD_GLOO_TIMEOUT_SECONDS``
        and ``pythonpath`` first on ``PYTHONPATH`` (the repository, for ``pgc_hvd``)."""
        env = self.env()
        env.update(OMP_NUM_THREADS="1", HOROVOD_GLOO_TIMEOUT_SECONDS=str(gloo_timeout),
                   PYTHONPATH=os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")]))
        return env

    def accepted_logins(self) -> int:
        """ssh logins sshd accepted so far (proof that horovodrun went through ssh)."""
        try:
            return self.log.read_text().count("Accepted publickey")
        except (OSError, AttributeError):
            return 0

    # -- tear-down -----------------------------------------------------------------
    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:   # sshd and the sessions it forked (its own process group)
                os.killpg(self.proc.pid, 15)
            except OSError:
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "LocalHosts":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> int:
    count = int((argv or sys.argv[1:] or ["4"])[0])
    with LocalHosts(count=count) as lh:
        print(f"hosts: {' '.join(lh.hosts)}")
        print(f"PATH={lh.dir / 'bin'}:$PATH horovodrun --gloo -np {count} -H {lh.spec(1)} "
              f"{' '.join(lh.horovodrun_args())} python ...")
        print("Ctrl-C stops the sshd and removes its folder", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
