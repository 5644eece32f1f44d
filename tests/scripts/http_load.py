"""Load on an endpoint from a process of its own (so it takes none of the endpoint's GIL), for the tests and
benchmarks of fair service. On loopback only; it stops when its standard input closes, or after --seconds.

    python http_load.py pipeline PORT [--connections 8] [--requests 2000]
        Each connection sends REQUESTS pipelined ``HEAD /metrics`` and never reads a byte.
    python http_load.py polite PORT [--clients 64]
        Each client scrapes ``GET /metrics`` back to back on a kept-alive connection, reading every answer.
    python http_load.py crowd PORT [--addresses 300] [--silent]
        Each of ADDRESSES loopback addresses (127.0.1.1 on) holds one connection, idle after one answered
        ``GET /-/healthy``, or with --silent connected and saying nothing; one the server closes is opened again.

Prints ``ready`` once the load is on (every pipelining connection has sent requests, and one of them has an answer
waiting, unread; every polite client has been answered once), and at the end one line:
``answered N of M`` (pipeline: answers waiting in the connections' buffers, of the requests sent; polite: answers
read, of the requests sent; crowd: connections answered, of those opened).
"""

from __future__ import annotations

import argparse
import http.client
import select
import socket
import sys
import threading

REQUEST = b"HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def pipeline(port: int, connections: int, requests: int, stop: threading.Event) -> tuple[int, int]:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(connections)]
    sent = [False] * connections  # its first bytes
    senders = [
        threading.Thread(target=_send_all, args=(s, REQUEST * requests, stop, sent, n)) for n, s in enumerate(socks)
    ]
    for sender in senders:
        sender.start()
    while not stop.is_set() and not (all(sent) and select.select(socks, [], [], 0.01)[0]):
        pass
    print("ready", flush=True)
    stop.wait()
    answered = 0
    for sock in socks:
        sock.shutdown(socket.SHUT_WR)  # ends a sender still blocked on a full buffer
    for sender in senders:
        sender.join()
    for sock in socks:  # only now, at the end: what the server had sent
        answered += _drain(sock).count(b"HTTP/1.1 ")
        sock.close()
    return answered, connections * requests


def polite(port: int, clients: int, stop: threading.Event) -> tuple[int, int]:
    answered, asked = [0] * clients, [0] * clients
    first = threading.Barrier(clients + 1, timeout=120)

    def scrape(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        waiting_at_barrier = True
        while not stop.is_set():
            asked[index] += 1
            connection.request("GET", "/metrics")
            connection.getresponse().read()
            answered[index] += 1
            if waiting_at_barrier:
                first.wait()
                waiting_at_barrier = False
        connection.close()

    threads = [threading.Thread(target=scrape, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    first.wait()
    print("ready", flush=True)
    stop.wait()
    for thread in threads:
        thread.join(timeout=120)
    return sum(answered), sum(asked)


def crowd(port: int, addresses: int, silent: bool, stop: threading.Event) -> tuple[int, int]:
    """Once ready, every address has held a connection (answered once unless silent); the server may have closed
    some to make room, and those are opened again, each in its turn, until the end."""
    counts = {"answered": 0, "opened": 0}

    def hold(address: str) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(address, 0))
            counts["opened"] += 1
            if not silent:
                sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                if sock.recv(65536).startswith(b"HTTP/1.1 200"):  # a short answer: one read takes it
                    counts["answered"] += 1
            sock.setblocking(False)
            return sock
        except OSError:
            return None

    held = {f"127.0.{1 + n // 250}.{1 + n % 250}": None for n in range(addresses)}
    for address in held:
        held[address] = hold(address)
    print("ready", flush=True)
    while not stop.wait(0.05):
        for address, sock in held.items():
            if sock is None or closed(sock):
                if sock is not None:
                    sock.close()
                held[address] = hold(address)
    for sock in held.values():
        if sock is not None:
            sock.close()
    return counts["answered"], counts["opened"]


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _send_all(sock: socket.socket, data: bytes, stop: threading.Event, sent: list[bool], index: int) -> None:
    view = memoryview(data)
    while view and not stop.is_set():
        try:
            view = view[sock.send(view) :]
            sent[index] = True
        except TimeoutError:
            continue
        except OSError:
            return


def _drain(sock: socket.socket) -> bytes:
    chunks = []
    sock.setblocking(False)
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("load", choices=("pipeline", "polite", "crowd"))
    parser.add_argument("port", type=int)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--addresses", type=int, default=300)
    parser.add_argument("--silent", action="store_true")
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    timer = threading.Timer(args.seconds, stop.set)
    timer.daemon = True
    timer.start()
    if args.load == "pipeline":
        answered, sent = pipeline(args.port, args.connections, args.requests, stop)
    elif args.load == "polite":
        answered, sent = polite(args.port, args.clients, stop)
    else:
        answered, sent = crowd(args.port, args.addresses, args.silent, stop)
    print(f"answered {answered} of {sent}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
