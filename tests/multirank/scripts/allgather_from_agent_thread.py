"""Runs on every rank under horovodrun: the runtime's foundation.

Each rank starts a background "communication agent" thread that takes part in R rounds of a
variable-size ``hvd.allgather`` (rank r contributes rows(r, round) rows, zero for some ranks)
while the rank's main thread is busy computing. Checks, on every rank:

* every round's result is exactly the expected concatenation (same on all ranks);
* the agent finished all rounds while the main thread was still busy, i.e. collectives progress
  without the main thread's help.
Exits non-zero on failure; prints one line "OK rank=..." on success.
"""

import sys
import threading
import time

import horovod.torch as hvd
import torch

ROUNDS = 6
COLS = 3
BUSY_SECONDS = 4.0


def rows(rank: int, rnd: int) -> int:
    # Odd ranks send nothing in even rounds; rank 0 always sends; sizes differ per rank.
    if rank % 2 == 1 and rnd % 2 == 0:
        return 0
    return rank + 1 + rnd % 3


def message(rank: int, rnd: int) -> torch.Tensor:
    r = rows(rank, rnd)
    base = torch.arange(r * COLS, dtype=torch.float32).view(r, COLS)
    return base + 1000.0 * rank + 100000.0 * rnd


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results: list = []
    agent_done = threading.Event()
    errors: list = []

    def agent() -> None:
        try:
            for rnd in range(ROUNDS):
                results.append(hvd.allgather(message(rank, rnd), name=f"agent.round{rnd}"))
        except Exception as err:  # surfaced by the main thread
            errors.append(err)
        finally:
            agent_done.set()

    # Main thread busy: matrix products for BUSY_SECONDS (torch releases the GIL inside them).
    a = torch.randn(256, 256)
    thread = threading.Thread(target=agent, name="pgc-agent", daemon=True)
    start = time.monotonic()
    thread.start()
    agent_finished_while_busy = False
    while time.monotonic() - start < BUSY_SECONDS:
        a = torch.tanh(a @ a)
        if agent_done.is_set() and not agent_finished_while_busy:
            agent_finished_while_busy = True
    busy_end = time.monotonic()
    thread.join(timeout=60)
    if errors:
        raise errors[0]
    if len(results) != ROUNDS:
        print(f"FAIL rank={rank}: agent completed {len(results)} of {ROUNDS} rounds", flush=True)
        return 1
    for rnd, got in enumerate(results):
        want = torch.cat([message(r, rnd) for r in range(size)], dim=0)
        if got.shape != want.shape or not torch.equal(got, want):
            print(f"FAIL rank={rank} round={rnd}: got shape {tuple(got.shape)}, want "
                  f"{tuple(want.shape)}", flush=True)
            return 1
    if not agent_finished_while_busy:
        print(f"FAIL rank={rank}: agent needed the main thread ({busy_end - start:.2f}s busy)",
              flush=True)
        return 1
    # All ranks saw identical concatenations: compare a checksum across ranks.
    checksum = torch.tensor([float(sum(t.double().sum() for t in results))], dtype=torch.float64)
    all_checksums = hvd.allgather(checksum, name="checksum")
    if not torch.all(all_checksums == all_checksums[0]):
        print(f"FAIL rank={rank}: checksums differ across ranks {all_checksums.tolist()}",
              flush=True)
        return 1
    print(f"OK rank={rank} size={size} rounds={ROUNDS} zero_row_ranks="
          f"{[r for r in range(size) if rows(r, 0) == 0]}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
