"""One rank of the streams benchmark: one exchange striped over N TCP connections at once.

``--transport gloo``: each stream is a gloo process group of its own (so its own TCP
connection to the peer); a buffer of --mib MiB is cut into N parts and all-reduced on the N
groups concurrently. Before each exchange both ranks meet at a barrier and then stay idle for
--gap seconds, like a step's compute, so the connections see the same idle gap a training step
gives them.

``--transport tcp``: the transport alone, without gloo's protocol: rank 0 sends the buffer's N
parts over N plain TCP connections at once and rank 1 answers each part with one byte once it
has all of it; rank 0 is idle for --gap seconds before each. Its floor is one round trip plus
the buffer at the link's rate.

The stream counts are interleaved repeat by repeat, so a slow minute of the link hits every
count alike; a first round, not reported, opens the connections' windows as a training job's
first steps do. Rank 0 prints one JSON line per exchange:
{"streams": N, "repeat": r, "seconds": s, "mib": m}.

    python python/benchmarks/streams.py --rank 0 --master 198.18.1.10 --streams 1,2,4,8
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import struct
import threading
import time

import torch
import torch.distributed as dist

PORT = 29531


def _group(timeout: datetime.timedelta) -> dist.ProcessGroup:
    """A new group of both ranks: a connection of its own."""
    g = dist.new_group([0, 1], timeout=timeout)
    # new_group answers a sentinel only to a rank outside the group; both are in it.
    assert isinstance(g, dist.ProcessGroup)
    return g


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        c = conn.recv(min(n - got, 1 << 20))
        if not c:
            raise ConnectionError(f"the peer closed after {got} of {n} bytes")
        chunks.append(c)
        got += len(c)
    return b"".join(chunks)


def _serve(conn: socket.socket) -> None:
    """Rank 1's side of one connection: a part (length first), then one byte back."""
    with conn:
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8:
                return
            (n,) = struct.unpack("!Q", head)
            _recv_exact(conn, n)
            conn.sendall(b"k")


def _send_part(conn: socket.socket, part: bytes) -> None:
    conn.sendall(struct.pack("!Q", len(part)) + part)
    if _recv_exact(conn, 1) != b"k":
        raise ConnectionError("unexpected answer")


def run_tcp(args: argparse.Namespace, counts: list[int]) -> None:
    total = sum(counts)
    if args.rank == 1:
        with socket.create_server(("", PORT)) as srv:
            threads = []
            for _ in range(total):
                conn, _ = srv.accept()
                t = threading.Thread(target=_serve, args=(conn,), daemon=True)
                t.start()
                threads.append(t)
            for t in threads:
                t.join()
        return
    deadline = time.monotonic() + args.timeout
    conns: dict[int, list[socket.socket]] = {}
    for n in counts:
        conns[n] = []
        for _ in range(n):
            while True:  # rank 1 may not listen yet
                try:
                    conns[n].append(socket.create_connection((args.peer, PORT), timeout=5))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    for c in (c for cs in conns.values() for c in cs):
        c.settimeout(args.timeout)
    buf = b"\0" * int(args.mib * (1 << 20))
    for r in range(-1, args.repeats):  # repeat -1 warms the windows up and is not reported
        for n in counts:
            time.sleep(args.gap)
            size = -(-len(buf) // n)
            parts = [buf[i * size:(i + 1) * size] for i in range(n)]
            t0 = time.monotonic()
            threads = [threading.Thread(target=_send_part, args=(c, p))
                       for c, p in zip(conns[n], parts)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.monotonic() - t0
            if r < 0:
                continue
            row = {"streams": n, "repeat": r, "seconds": round(seconds, 4), "mib": args.mib}
            print(json.dumps(row), flush=True)
    for c in (c for cs in conns.values() for c in cs):
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rank", type=int, required=True, choices=(0, 1))
    ap.add_argument("--master", required=True, help="rank 0's address")
    ap.add_argument("--mib", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--streams", default="1,2,4,8", help="stream counts, comma-separated")
    ap.add_argument("--gap", type=float, default=1.0, help="idle seconds before each exchange")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per collective")
    ap.add_argument("--transport", choices=("gloo", "tcp"), default="gloo")
    ap.add_argument("--peer", help="rank 1's address (tcp: rank 0 connects to it)")
    args = ap.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    if not counts or min(counts) < 1 or args.mib <= 0 or args.repeats < 1:
        ap.error("--streams must list counts >= 1; --mib and --repeats must be positive")
    if args.transport == "tcp":
        if args.rank == 0 and not args.peer:
            ap.error("--transport tcp needs --peer on rank 0")
        run_tcp(args, counts)
        return

    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}:{PORT}",
        rank=args.rank,
        world_size=2,
        timeout=timeout,
    )
    groups = {n: [_group(timeout) for _ in range(n)] for n in counts}
    buf = torch.ones(int(args.mib * (1 << 20)) // 4)
    for r in range(-1, args.repeats):  # repeat -1 warms the windows up and is not reported
        for n in counts:
            dist.barrier()
            time.sleep(args.gap)
            t0 = time.monotonic()
            works = [
                dist.all_reduce(part, group=g, async_op=True)
                for part, g in zip(buf.chunk(n), groups[n])
            ]
            for w in works:
                assert w is not None
                w.wait()
            seconds = time.monotonic() - t0
            if args.rank == 0 and r >= 0:
                row = {"streams": n, "repeat": r, "seconds": round(seconds, 4), "mib": args.mib}
                print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
