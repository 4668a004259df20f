"""Leave a broken Horovod world at once: shut down this rank's gloo sockets, so that the failure
cascades to every survivor within milliseconds instead of ``HOROVOD_GLOO_TIMEOUT_SECONDS``.

Why the survivors of a SIGKILLed rank waited for the gloo timeout (horovod 0.28.1, its bundled
gloo; measured on the 4-host loopback elastic setup, docs/elastic.md section 3):

* gloo signals a broken connection only to the operations pending *on that connection*
  (``tcp::Pair::signalException``). The dead rank's sockets are closed by the kernel, so a
  survivor with an operation pending on its pair to the dead rank fails at once (0.03-0.1 s);
  a survivor blocked on a receive from another *survivor* is not told, and that survivor may
  itself be blocked on a third. Horovod's negotiation (gather to rank 0, binomial-tree
  broadcast, ring allreduce of the cache bits) and its ring allgather make such chains on most
  kills: in 5 of 6 self-kills at version 20, one survivor noticed within 0.1 s and the others
  only when their receive timed out (``Timed out waiting 30000ms for recv operation``).
* the first survivor's own exit does not reach them: Horovod's ``hvd.shutdown()`` leaves the
  gloo context that carries every collective and the negotiation open. A 3-rank run holds 8
  established gloo sockets after ``hvd.init()`` (4 full-mesh contexts x 2 peers) and still 6
  after ``hvd.shutdown()``, the busiest among them (``benchmarks/elastic/hvd_shutdown_sockets.py``).
  So the first survivor re-enters the rendezvous while its old sockets stay open, and its
  peers' receives from it wait out the timeout.

The mechanism: :class:`GlooSockets` knows this rank's sockets of the current world -- the TCP
connections established across ``hvd.init()`` (:meth:`~GlooSockets.mark` before, :meth:`~
GlooSockets.adopt` after: the inodes of ``/proc/self/fd`` sockets that are ESTABLISHED in
``/proc/net/tcp{,6}`` now and were not there before). When the world breaks
(:meth:`~GlooSockets.cascade`, called by the elastic state on the first ``HorovodInternalError``
this rank sees, from the thread that sees it), each of them gets ``shutdown(SHUT_RDWR)`` through a
duplicate of its descriptor (the duplicate is checked to be the same socket, then closed; the
original stays Horovod's to close). Every peer blocked on a receive from this rank then reads
end-of-file at once, its collective fails, it raises ``HorovodInternalError`` in turn and shuts
its own sockets: the failure follows the chain of waits, one Python reaction (milliseconds) per
link, and no survivor waits for a timeout. This rank's own background thread, blocked on a
peer, wakes up the same way, so its ``hvd.shutdown()`` returns at once too.

Not touched: sockets opened before the mark or after the adopt (the elastic notification
service, the rendezvous's HTTP requests, ssh, pgc_hvd's control store, the user's own), and
listening sockets. Where ``/proc`` is missing (not Linux) every method is a no-op and a dead rank
costs the gloo timeout as before.

Owns :class:`GlooSockets` (this rank's sockets of the current world, under its lock) and
:data:`SOCKETS`, the process's tracker. Threads: import time (the first mark), the training
thread (mark, adopt, cascade), the agent thread (cascade and mark: the elastic state's
``on_stop``).
May import: the standard library only.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Iterable, Optional

log = logging.getLogger(__name__)

ESTABLISHED = "01"   # /proc/net/tcp "st" column (include/net/tcp_states.h: TCP_ESTABLISHED)


def parse_proc_net_tcp(text: str) -> dict[int, tuple[str, str, str]]:
    """``/proc/net/tcp`` (or ``tcp6``) text -> ``{inode: (state, local, remote)}``, the state as
    the kernel's two hex digits (``"01"`` ESTABLISHED, ``"0A"`` LISTEN) and the addresses as the
    kernel writes them (``"0100007F:1F90"``). Rows without an inode (0: a socket in TIME_WAIT)
    are left out."""
    out = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10 or ":" not in f[0]:
            continue
        try:
            inode = int(f[9])
        except ValueError:
            continue
        if inode:
            out[inode] = (f[3].upper(), f[1], f[2])
    return out


def socket_inode(link: str) -> Optional[int]:
    """The inode of a ``/proc/<pid>/fd`` link ``"socket:[12345]"``; None for anything else."""
    if link.startswith("socket:[") and link.endswith("]"):
        try:
            return int(link[8:-1])
        except ValueError:
            return None
    return None


def endpoint(addr: str) -> tuple[str, int]:
    """A ``/proc/net/tcp{,6}`` address (``"0100007F:1F90"``) -> ``("127.0.0.1", 8080)``."""
    host, port = addr.split(":")
    raw = bytes.fromhex(host)
    # the kernel prints the address as 32-bit words in host (little-endian here) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        ip = socket.inet_ntop(socket.AF_INET, words)
    else:
        ip = socket.inet_ntop(socket.AF_INET6, words)
        if ip.startswith("::ffff:") and "." in ip:
            ip = ip[7:]
    return ip, int(port, 16)


def select_world(before: Iterable[int], table: dict[int, tuple[str, str, str]],
                 fds: dict[int, int], exclude: Iterable[tuple[str, int]] = ()) -> set[int]:
    """The inodes of the world's sockets: this process's sockets (``fds``: inode -> fd) that are
    ESTABLISHED TCP connections in ``table`` now, were not among ``before``, and whose remote
    end is not in ``exclude`` (``(ip, port)``: the rendezvous server)."""
    before, exclude = set(before), set(exclude)
    world = set()
    for inode in fds:
        row = table.get(inode)
        if inode in before or row is None or row[0] != ESTABLISHED:
            continue
        if exclude and endpoint(row[2]) in exclude:
            continue
        world.add(inode)
    return world


class GlooSockets:
    """This rank's sockets of the current Horovod world, and their shutdown (module doc).

    ``proc``: where procfs is mounted (tests point it at a folder). Thread-safe: the agent
    thread and the training thread may both call :meth:`cascade`; the first call does it."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self.available = os.path.isdir(os.path.join(proc, "self", "fd")) and os.path.exists(
            os.path.join(proc, "net", "tcp"))
        self._lock = threading.Lock()
        self._before: set[int] = set()
        self._world: set[int] = set()
        self.shut = 0          # sockets shut down by the last cascade
        self.mark()

    # -- reading /proc -----------------------------------------------------------------
    def _fds(self) -> dict[int, int]:
        """inode -> fd of this process's sockets."""
        out = {}
        folder = os.path.join(self.proc, "self", "fd")
        try:
            names = os.listdir(folder)
        except OSError:
            return out
        for name in names:
            try:
                inode = socket_inode(os.readlink(os.path.join(folder, name)))
            except OSError:   # closed meanwhile
                continue
            if inode is not None:
                out[inode] = int(name)
        return out

    def _table(self) -> dict[int, tuple[str, str, str]]:
        table = {}
        for name in ("tcp", "tcp6"):
            try:
                with open(os.path.join(self.proc, "net", name)) as f:
                    table.update(parse_proc_net_tcp(f.read()))
            except OSError:
                continue
        return table

    # -- the world's sockets -----------------------------------------------------------------
    def mark(self) -> None:
        """Remember every socket this process holds now (call before ``hvd.init()``)."""
        if self.available:
            with self._lock:
                self._before = set(self._fds())

    def adopt(self, exclude: Iterable[tuple[str, int]] = ()) -> int:
        """After ``hvd.init()``: the established TCP connections opened since :meth:`mark`
        (the remote ends in ``exclude`` left out) are the world's; returns how many."""
        if not self.available:
            return 0
        with self._lock:
            table = self._table()
            self._world = select_world(self._before, table, self._fds(), exclude)
            found = len(self._world)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("pgc_hvd elastic: this world's gloo sockets: %s", sorted(
                    (endpoint(table[i][1]), endpoint(table[i][2])) for i in self._world))
        log.info("pgc_hvd elastic: %d gloo sockets in this world", found)
        return found

    @property
    def world(self) -> set[int]:
        with self._lock:
            return set(self._world)

    def cascade(self) -> int:
        """Shut down (``SHUT_RDWR``) every socket of the world that is still open; returns how
        many. The world is forgotten, so a second call does nothing."""
        with self._lock:
            world, self._world = self._world, set()
            if not world:
                return 0
            shut = 0
            for inode, fd in self._fds().items():
                if inode in world and _shutdown(fd, inode):
                    shut += 1
            self.shut = shut
        log.info("pgc_hvd elastic: shut down %d of this rank's %d gloo sockets so that the "
                 "other ranks leave the broken world at once", shut, len(world))
        return shut


def _shutdown(fd: int, inode: int) -> bool:
    """``shutdown(SHUT_RDWR)`` of the socket behind ``fd``, through a duplicate that is checked
    to be the socket ``inode`` (the fd may have been closed and reused since it was listed)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return False
    try:
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:       # not connected any more
        return False
    finally:
        sock.close()      # the duplicate only


def rendezvous_endpoints(env=None) -> list[tuple[str, int]]:
    """``(ip, port)`` of Horovod's rendezvous server (``HOROVOD_GLOO_RENDEZVOUS_ADDR`` /
    ``_PORT``), whose connections are never the world's; [] when not set."""
    env = os.environ if env is None else env
    addr, port = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if not addr or not port:
        return []
    try:
        infos = socket.getaddrinfo(addr, int(port), proto=socket.IPPROTO_TCP)
    except (OSError, ValueError):
        return []
    return sorted({(info[4][0], int(port)) for info in infos})


#: the process's tracker, marked at import: ``import pgc_hvd.runtime.elastic`` (which imports
#: this module) before ``hvd.init()`` lets the first world's sockets be found
SOCKETS = GlooSockets()
