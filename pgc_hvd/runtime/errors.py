"""The runtime's one error type and who it names.

:class:`AgentError` is what a rank raises when the run cannot step past a fault: a rank that
died, hung or whose training thread raised, a step that cannot be decoded. Who is at fault is in
typed fields, never in the text (read the fields, not the message):

* ``failed_ranks``: ranks whose training thread raised (their control rows said so);
* ``dead_ranks``: ranks whose process is gone (a failed collective or control store naming
  them, a census of the survivors over the control store); a dead rank 0 is the decider and
  the store's server (``control="log"``);
* ``hung_ranks``: ranks that are alive as far as anyone can tell but did not answer within the
  timeout (a census over a store that still answers, the decider's wait for rows).

``broken_world``: the fault is the loss of a rank of the world (a collective failed or the
control store is gone), not a refusal of the protocol: Horovod's elastic mode can re-form the
world without it (:func:`pgc_hvd.runtime.elastic.world_error`).

Owns :class:`AgentError`; no state. Threads: any (raised on the agent thread, kept and raised
again on the training thread; raised there directly too).
May import: the standard library only.
"""

from __future__ import annotations


class AgentError(RuntimeError):
    """A fault the runtime cannot step past (module doc)."""

    def __init__(self, *args, failed_ranks=(), dead_ranks=(), hung_ranks=(),
                 broken_world: bool = False):
        super().__init__(*args)
        self.failed_ranks = tuple(int(w) for w in failed_ranks)
        self.dead_ranks = tuple(int(w) for w in dead_ranks)
        self.hung_ranks = tuple(int(w) for w in hung_ranks)
        self.broken_world = bool(broken_world or self.dead_ranks)

    def fields(self) -> dict:
        """The typed fields, to carry into another AgentError or over the control log."""
        return {"failed_ranks": self.failed_ranks, "dead_ranks": self.dead_ranks,
                "hung_ranks": self.hung_ranks, "broken_world": self.broken_world}
