"""CPU per cast down the casting tree, every node's work added up, over the in-memory loopback.

One process runs the sender and every destination's router (no sockets, no actors), so the
figure is the kernel's own cost of a cast: framing, forwarding, mailboxes and, since the tree
acknowledges what it passes on, the kept messages and their acknowledgements. Run it against two
checkouts to compare them:

    PYTHONPATH=src python benchmarks/cast_ack_cost.py 64 16
    PYTHONPATH=/path/to/other/src python benchmarks/cast_ack_cost.py 64 16

Arguments: destinations (default 8) and cast_fanout (default 2). Prints the best of 5 rounds of
2,000 casts, in microseconds of process CPU per cast.
"""

from __future__ import annotations

import pickle
import sys
import time

from regency import config
from regency._runtime.kernel import casting
from regency._runtime.kernel.loopback import Loopback

MESH, SENDER, CASTS, ROUNDS = 9, 5, 2000, 5


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    fanout = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    net = Loopback()
    root = net.router("unix:@root")
    addrs = [f"unix:@p{r}" for r in range(n)]
    for addr in addrs:
        net.router(addr).mailbox(MESH).attach(lambda delivery: None)
    body = [pickle.dumps("x")]
    best = float("inf")
    seq = 0
    with config.configured(cast_fanout=fanout):
        for _ in range(ROUNDS):
            start = time.process_time()
            for _ in range(CASTS):
                seq += 1
                dests = [casting.Dest(a, seq, rank) for rank, a in enumerate(addrs)]
                root.casts.send(casting.plan(dests, fanout), MESH, SENDER, None, False, body)
                net.pump()
            net.timers.advance(1.0)  # the acknowledgements of the round
            net.pump()
            best = min(best, (time.process_time() - start) / CASTS)
    print(f"{best * 1e6:.1f} us of CPU per cast to {n} destinations (cast_fanout {fanout})")


if __name__ == "__main__":
    main()
