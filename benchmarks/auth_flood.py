"""What a wrong-password flood costs a training loop whose process serves the endpoint with basic auth.

A small MLP trained on the CPU (torch, one thread: the same work every step, about 1 ms) in the process that serves
/metrics with basic auth (a bcrypt hash of cost 10, as ``htpasswd -nBC 10`` makes) and, with --tls, TLS. Blocks of
steps alternate: quiet, and while --flooders other processes, each on --connections connections at once, send wrong
passwords as fast as they are answered: on kept-alive connections, opening a new one after a 429, or with
--no-keep-alive a new one for every guess. Meanwhile a scraper with the right password scrapes once a second from
the same address. Prints the median steps/s of each kind of block, their ratio, and what the flood got: 401s,
429s, connection errors, and the bcrypt checks it cost.

The flooders run at the lowest CPU priority (--nice), so that what is measured is the cost to the serving process
rather than the flooders' own competition for the cores: a real attacker runs on other machines.

    python benchmarks/auth_flood.py [--rounds 10] [--seconds 1.0] [--flooders 8] [--connections 1] [--tls]
                                    [--no-keep-alive]
"""

from __future__ import annotations

import argparse
import base64
import collections
import http.client
import multiprocessing
import os
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import bcrypt

from neuron_exporter.web.http_server import MetricsServer

USER, PASSWORD = "prometheus", "s3cret"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def connect(port: int, tls: bool) -> http.client.HTTPConnection:
    if not tls:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)


def flood(port: int, tls: bool, keep_alive: bool, connections: int, nice: int, flooding, stop, results) -> None:
    """One flooding process: ``connections`` threads, each sending wrong passwords one after the other while
    ``flooding`` is set."""
    os.nice(nice)
    statuses: collections.Counter[int | str] = collections.Counter()
    lock = threading.Lock()

    def guess_on(thread: int) -> None:
        connection, guess = None, 0
        while not stop.is_set():
            if not flooding.wait(0.05):
                continue
            try:
                connection = connection or connect(port, tls)
                guess += 1
                connection.request("GET", "/metrics", headers=basic(USER, f"guess-{os.getpid()}-{thread}-{guess}"))
                response = connection.getresponse()
                response.read()
                status = response.status
                if status == 429 or not keep_alive or response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as error:
                status = type(error).__name__
                connection = None
            with lock:
                statuses[status] += 1

    threads = [threading.Thread(target=guess_on, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(dict(statuses))


def make_step():
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def steps_per_second(step, seconds: float) -> float:
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step()
        steps += 1
    return steps / elapsed


def web_config(directory: Path, tls: bool) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    text = f"basic_auth_users:\n  {USER}: {hashed}\n"
    if tls:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=x",
                "-keyout",
                str(directory / "server.key"),
                "-out",
                str(directory / "server.crt"),
            ],
            check=True,
            capture_output=True,
        )
        text += "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
    (directory / "web.yml").write_text(text)
    return directory / "web.yml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0, help="length of each block")
    parser.add_argument("--flooders", type=int, default=8)
    parser.add_argument("--connections", type=int, default=1, help="concurrent connections of each flooder")
    parser.add_argument("--nice", type=int, default=19)
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--no-keep-alive", dest="keep_alive", action="store_false")
    args = parser.parse_args()

    server = MetricsServer(
        lambda: b"# TYPE demo counter\ndemo 1\n", "127.0.0.1", 0, web_config(Path(tempfile.mkdtemp()), args.tls)
    ).start()
    checks = []  # from now on: loading the config checked each hash once too
    real_checkpw = bcrypt.checkpw
    bcrypt.checkpw = lambda password, hashed: checks.append(1) or real_checkpw(password, hashed)
    context = multiprocessing.get_context("spawn")
    flooding, stop, results = context.Event(), context.Event(), context.Queue()
    flood_args = (server.port, args.tls, args.keep_alive, args.connections, args.nice, flooding, stop, results)
    flooders = [context.Process(target=flood, args=flood_args) for _ in range(args.flooders)]
    for process in flooders:
        process.start()

    scrapes: collections.Counter[int | str] = collections.Counter()

    def scrape() -> None:
        connection = None
        while not stop.wait(1.0):
            try:
                connection = connection or connect(server.port, args.tls)
                connection.request("GET", "/metrics", headers=basic(USER, PASSWORD))
                response = connection.getresponse()
                response.read()
                scrapes[response.status] += 1
            except (OSError, http.client.HTTPException) as error:
                scrapes[type(error).__name__] += 1
                connection = None

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()

    step = make_step()
    steps_per_second(step, 1.0)  # warm up
    rates: dict[str, list[float]] = {"quiet": [], "flood": []}
    flood_seconds = 0.0
    for _ in range(args.rounds):
        for kind in ("quiet", "flood"):
            if kind == "flood":
                flooding.set()
            else:
                flooding.clear()
            steps_per_second(step, 0.2)  # the flooders start or stop
            rates[kind].append(steps_per_second(step, args.seconds))
            flood_seconds += args.seconds + 0.2 if kind == "flood" else 0.0
    flooding.clear()
    stop.set()
    statuses: collections.Counter[int | str] = collections.Counter()
    for _ in flooders:
        statuses.update(results.get())
    for process in flooders:
        process.join()
    scraper.join()
    server.stop()

    quiet, flooded = statistics.median(rates["quiet"]), statistics.median(rates["flood"])
    answered = sum(statuses.values())
    print(
        f"{args.rounds} rounds of {args.seconds:g} s blocks, {args.flooders} flooding processes x "
        f"{args.connections} connections (nice {args.nice}, "
        f"{'kept-alive' if args.keep_alive else 'a connection per guess'}), "
        f"{'HTTPS' if args.tls else 'HTTP'}, bcrypt cost 10"
    )
    print(f"  steps/s without a flood   {quiet:8.1f}")
    print(f"  steps/s during the flood  {flooded:8.1f}   x{flooded / quiet:.3f} of the rate without")
    print(
        f"  flood: {answered} answered or failed ({answered / flood_seconds:.0f}/s), "
        f"{', '.join(f'{key}: {value}' for key, value in sorted(statuses.items(), key=str))}; "
        f"bcrypt checks: {len(checks)}"
    )
    print(f"  the scraper with the right password: {dict(scrapes)}")


if __name__ == "__main__":
    main()
