#!/usr/bin/env python3
"""Many long-lived TCP flows, each sending a little every second: the load of a daemon that
tracks flows (its tracepoints see every ACK), without saturating anything.

  flowgen.py server ADDR PORT
  flowgen.py client ADDR PORT FLOWS     prints "connected N" once all are up
"""
import resource
import selectors
import socket
import sys
import time


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard, n + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def server(addr, port):
    raise_nofile(200_000)
    sel = selectors.DefaultSelector()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(4096)
    ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ)
    print("listening", flush=True)
    while True:
        for key, _ in sel.select():
            s = key.fileobj
            if s is ls:
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ)
            else:
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    data = b""
                if not data:
                    sel.unregister(s)
                    s.close()


def client(addr, port, flows):
    raise_nofile(flows)
    socks = []
    for _ in range(flows):
        s = socket.create_connection((addr, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks.append(s)
    print(f"connected {len(socks)}", flush=True)
    payload = b"x" * 64
    # Each flow sends once a second, spread evenly over the second.
    slices = 100
    per = (len(socks) + slices - 1) // slices
    start = time.monotonic()
    n = 0
    while True:
        i = n % slices
        for s in socks[i * per:(i + 1) * per]:
            try:
                s.send(payload)
            except BlockingIOError:
                pass
        n += 1
        delay = start + n / slices - time.monotonic()
        if delay > 0:
            time.sleep(delay)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]))
    else:
        client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
