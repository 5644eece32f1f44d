"""A training job's own node endpoint: a process that a training process starts to serve every rank of the machine.

Merging the spool of a 128-rank node costs tens of milliseconds of Python per scrape; done in a training process, it
takes that process's GIL from its training thread, and in data-parallel training every rank waits for the slowest.
So a training process that holds the port (``node_view``, the default) hands the bound socket to this process, which
serves the node view from the spool and asks the training process, over a socket pair (``job_link``), only for its
own exposition: the same bounded render a rank's own endpoint costs.

Which runs it serves: on the port the job was given (``port`` set, 19478 by default), every run of the spool, as the
daemon does. That port is the node's endpoint, the one Prometheus is told to scrape on every machine; a second job
on the machine cannot bind it, so its ranks reach it through the spool and are served here, told apart by
``run_id`` (giving the second job a port of its own would export it where no scrape config looks). On a port picked
for the job alone (``port=0``, reported by ``handle.port``), only the job's own run: every job then has its own
endpoint, and serving the other runs too would export them twice.

Without a daemon, nothing else tidies the spool: like the daemon, it removes the expired files of ranks that ended,
of every run, at its start and every ``spool_expiry.CHECK_INTERVAL_SECONDS`` (``spool_expiry.ExpiredFiles``).

It serves as long as the process that started it lives (it checks its parent twice a second) or until that process
stops it (``detach()``), and never outlives the job: the next rank to step then binds the port and starts another.

    python -m neuron_exporter.node.job_endpoint --listen-fd N --link-fd M
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time

from ..config import Options
from ..web.http_server import metrics_server
from .job_link import DIAGNOSIS, METRICS, Asker, read_answer
from .node_view import NodeView
from .spool_dir import Spool
from .spool_expiry import CHECK_INTERVAL_SECONDS, ExpiredFiles

log = logging.getLogger("neuron_exporter")

ASK_TIMEOUT_SECONDS = 2.0  # then the training process's spool file stands in for its own exposition
PARENT_CHECK_SECONDS = 0.5
CONFIG_TIMEOUT_SECONDS = 60.0


class JobEndpoint:
    def __init__(self, options: Options, spool: Spool, run_id: str, asker: Asker, every_run: bool):
        self.view = NodeView(options, spool, run_id=None if every_run else run_id).start_reading()
        self.asker = asker
        self._last_own: tuple[dict, bytes] | None = None  # the training process's last answer

    def render(self) -> bytes:
        answer = self.asker.ask(METRICS, ASK_TIMEOUT_SECONDS)
        if answer is not None and answer[0].get("meta") is not None:
            self._last_own = answer
        elif self._last_own is not None:
            # No answer in time (a step holding the GIL): its last answer, not its spool file, which can be older
            # than what was served already and would take its counters back.
            answer = self._last_own
        else:
            return self.view.render(own=None)
        document, exposition = answer
        return self.view.render(own=(document["meta"], exposition), own_idle=bool(document.get("idle")))

    def diagnosis(self) -> dict:
        answer = self.asker.ask(DIAGNOSIS, ASK_TIMEOUT_SECONDS)
        own = answer[0].get("diagnosis") if answer is not None else None
        return self.view.diagnosis(own=own if isinstance(own, dict) else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A training job's node endpoint (started by attach()).")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # it follows the training process, not the terminal
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    link = socket.socket(fileno=args.link_fd)
    listener = socket.socket(fileno=args.listen_fd)
    config, _ = read_answer(link, time.monotonic() + CONFIG_TIMEOUT_SECONDS)
    options = Options(**config["options"])
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spool = Spool.of(options)
    endpoint = JobEndpoint(options, spool, config["run_id"], Asker(link), bool(config.get("every_run")))
    server = metrics_server(
        endpoint.render, endpoint.diagnosis, options.addr, options.port, options.web_config_file, listener
    ).start()
    expired = ExpiredFiles(spool, options.expire_after_seconds)
    next_expiry = time.monotonic()
    while not stop.wait(PARENT_CHECK_SECONDS):
        if os.getppid() != parent or endpoint.asker.closed:
            break
        if time.monotonic() >= next_expiry:
            expired.remove()
            next_expiry = time.monotonic() + CHECK_INTERVAL_SECONDS
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
