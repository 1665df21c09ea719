"""Holds N TCP connections from ADDR to a listener on ADDR, both ends in this process, and
churns them on request: real connections to fill a flow table with.

Commands on stdin: "churn RATE SECS" replaces the oldest connections with new ones, RATE a
second for SECS seconds, and answers "churned K". End of input closes everything and exits.
Clients close with a reset (SO_LINGER 0): no TIME_WAIT is left behind.
"""

import resource
import socket
import struct
import sys
import time

LINGER_RESET = struct.pack("ii", 1, 0)


def main() -> None:
    addr, n = sys.argv[1], int(sys.argv[2])
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    listener = socket.socket()
    listener.bind((addr, 0))
    listener.listen(64)
    to = listener.getsockname()

    def connect() -> tuple[socket.socket, socket.socket]:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        client.connect(to)
        # The handshake is over when connect() returns: the next accept() is this one.
        server, peer = listener.accept()
        if peer != client.getsockname():
            raise RuntimeError(f"accepted {peer}, not {client.getsockname()}")
        return client, server

    pairs = [connect() for _ in range(n)]
    print(f"open {n} {to[1]}", flush=True)
    oldest = 0
    for line in sys.stdin:
        _, rate, secs = line.split()
        start, done = time.monotonic(), 0
        while (elapsed := time.monotonic() - start) < float(secs):
            while done < int(elapsed * float(rate)) + 1:
                for s in pairs[oldest]:
                    s.close()
                pairs[oldest] = connect()
                oldest = (oldest + 1) % n
                done += 1
            time.sleep(0.005)
        print(f"churned {done}", flush=True)
    for pair in pairs:
        for s in pair:
            s.close()


main()
