"""Where a training process's metrics are served, kept up for the life of ``attach()``.

A process that holds the port serves the node: it starts the job's node endpoint process (``node.job_link``) and
answers its questions from the spool thread; with ``node_view`` off, or while the endpoint process keeps failing to
start, it serves its own rank in-process. An endpoint process that ends before it served anything, soon after it
started, has failed to start; after ``ENDPOINT_MAX_FAILURES`` such failures in a row, the process serves its own rank
and starts an endpoint process again after ``ENDPOINT_RETRY_SECONDS``, twice as long after each round that fails
again (up to ``ENDPOINT_MAX_RETRY_SECONDS``). An endpoint process that served, and then ended (killed, say), is no
failure: it is started again at once, and the count starts over.

A process that does not hold the port writes its rank to the spool directory, where whoever holds the port reads it,
and takes the port over once it frees up.

The spool thread lives here: every ``spool_interval_seconds`` it writes the rank's file, and in between it answers
the endpoint process.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest

from ..config import Options
from ..node.job_link import DIAGNOSIS, METRICS, JobEndpointProcess
from ..web.http_server import MetricsServer, metrics_server
from ..web.web_config import WebConfig
from . import AUTOSTART_DIR
from .rank import rank_labels
from .self_metrics import SelfStats

log = logging.getLogger("neuron_exporter")
ENDPOINT_SHORT_LIFE_SECONDS, ENDPOINT_MAX_FAILURES = 10.0, 3
ENDPOINT_RETRY_SECONDS, ENDPOINT_MAX_RETRY_SECONDS = 60.0, 3600.0


class ServedRank(Protocol):
    """What the keeper needs of the ``attach()`` handle."""

    options: Options
    auto: bool
    stats: SelfStats

    @property
    def claimed(self) -> bool: ...

    def diagnosis(self) -> dict: ...

    def _meta(self, finished: bool = False) -> dict: ...

    def _write_spool(self, finished: bool = False) -> None: ...

    def take_up_earlier(self) -> None: ...


class EndpointKeeper:
    def __init__(self, rank: ServedRank, registry: CollectorRegistry, web_config: WebConfig | None):
        self.rank = rank
        self.options = rank.options
        self.registry = registry  # this rank's own families
        self.web_config = web_config
        self.server: MetricsServer | JobEndpointProcess | None = None
        self._endpoint_failures = 0  # endpoint processes in a row that ended right after they started
        self._retry_after = ENDPOINT_RETRY_SECONDS  # how long the next round of failures serves its own rank only
        self._retry_at: float | None = None  # monotonic: when to start an endpoint process again
        # ``port`` is read here once, by one rule (the user guide states it): a port given (19478 by default) is the
        # node's endpoint, shared by every job of the machine: whoever holds it serves every run of the spool, and a
        # process that could not bind it takes it over once it frees. ``port=0`` asks for a port of the job's own:
        # picked free once and kept for the life of the process, serving the job's run only.
        self.node_port: int | None = self.options.port or None
        self._own_port: int | None = None  # with port=0: the port picked the first time
        self._stop = threading.Event()
        self._spool_thread: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        return self.server.port if self.server else None

    @property
    def url(self) -> str | None:
        return self.server.url if self.server else None

    def serve(self, first_try: bool) -> None:
        # A process with a port of its own serves on it again if its endpoint process ends: its URL was printed or
        # registered. Should another process have taken it meanwhile, a new free port is picked.
        if self.node_port is not None:
            ports = [self.node_port]
        else:
            ports = [0] if self._own_port is None else [self._own_port, 0]
        for port in ports:
            try:
                self.server = self._bind(port)
                break
            except OSError as error:
                failure = error
        else:
            if first_try and not self.rank.auto:
                self._warn_port_taken(failure)
            return
        if self.node_port is None:
            if self._own_port not in (None, self.server.port):
                log.warning("neuron-exporter: this process's endpoint moved to %s (its port was taken)", self.url)
            self._own_port = self.server.port

    def _bind(self, port: int) -> MetricsServer | JobEndpointProcess:
        options = self.options
        if options.node_view and self._endpoint_failures < ENDPOINT_MAX_FAILURES:
            run_id = rank_labels()["run_id"]
            every_run = self.node_port is not None  # see node.job_endpoint: which runs a job's endpoint serves
            return JobEndpointProcess(options, port, run_id, every_run, self.web_config, AUTOSTART_DIR)
        return metrics_server(self.registry, self.rank.diagnosis, options.addr, port, self.web_config).start()

    def _warn_port_taken(self, error: OSError) -> None:
        options = self.options
        log.warning(
            "neuron-exporter: cannot listen on %s:%s (%s); training goes on: this rank's metrics go to the spool "
            "directory %s, which the process holding the port serves if it is a node endpoint (neuron-exporter "
            "serve, or another job's endpoint: it serves every run of its spool); this process takes the port over "
            "once it is free",
            options.addr,
            self.node_port,
            error.strerror or error,
            options.spool_dir,
        )

    def _endpoint_ended(self, endpoint: JobEndpointProcess) -> None:
        """An endpoint process that keeps ending soon after it started, before it served (it cannot start here), is
        not started again for a while: this process serves its own rank meanwhile, and says so."""
        if endpoint.served or endpoint.lived_seconds() > ENDPOINT_SHORT_LIFE_SECONDS:
            self._endpoint_failures, self._retry_after = 0, ENDPOINT_RETRY_SECONDS
            return
        self._endpoint_failures += 1
        self.rank.stats.record_error("scrape", RuntimeError("the node endpoint process ended right after it started"))
        if self._endpoint_failures == ENDPOINT_MAX_FAILURES:
            self._retry_at = time.monotonic() + self._retry_after
            log.warning(
                "neuron-exporter: the node endpoint process ended %d times right after it started (see its "
                "lines above); this process serves its own rank only, and starts it again in %gs",
                ENDPOINT_MAX_FAILURES,
                self._retry_after,
            )
            self._retry_after = min(2 * self._retry_after, ENDPOINT_MAX_RETRY_SECONDS)

    def _retry_endpoint(self) -> None:
        """Past the wait, the next bind starts an endpoint process again; one more failure waits twice as long."""
        self._retry_at = None
        self._endpoint_failures = ENDPOINT_MAX_FAILURES - 1
        if self.server is not None and not isinstance(self.server, JobEndpointProcess):
            self.server.stop()  # frees the port, bound again at once
            self.server = None
            self.serve(first_try=False)

    def _answer(self, kind: bytes) -> tuple[dict, bytes]:
        """The node endpoint process's question: this rank's exposition (and whether it has trained), or its
        diagnosis (once it has something to show: a process that compiled with torch.compile may have before any
        torch_xla step)."""
        rank = self.rank
        try:
            if kind == METRICS:
                return {"meta": rank._meta(), "idle": not rank.claimed}, generate_latest(self.registry)
            if kind == DIAGNOSIS:
                return {"diagnosis": rank.diagnosis() if rank.claimed else None}, b""
        except Exception as error:  # noqa: BLE001 (the endpoint serves the spool file instead)
            rank.stats.record_error("scrape", error)
        return {"meta": None, "diagnosis": None}, b""

    def start_spool_thread(self) -> None:
        # A new event, not clear(): in a forked child the old one's lock may be held by the parent's spool thread.
        self._stop = threading.Event()
        self._spool_thread = threading.Thread(target=self._spool_loop, name="neuron-exporter-spool", daemon=True)
        self._spool_thread.start()

    def stop_spool_thread(self) -> None:
        self._stop.set()
        if isinstance(self.server, JobEndpointProcess):
            self.server.wake()
        if self._spool_thread is not None:
            self._spool_thread.join()
            self._spool_thread = None

    def _spool_loop(self) -> None:
        interval = self.options.spool_interval_seconds
        next_write = time.monotonic() + interval
        try:
            self.rank.take_up_earlier()  # before anything is served: the earlier process's counts come first
        except Exception as error:  # noqa: BLE001
            self.rank.stats.record_error("spool", error)
        while not self._stop.is_set():
            try:
                next_write = self._spool_turn(next_write, interval)
            except Exception as error:  # noqa: BLE001 (the thread outlives any failure, or the rank would look dead)
                self.rank.stats.record_error("spool", error)
                self._stop.wait(interval)

    def _spool_turn(self, next_write: float, interval: float) -> float:
        """Answer the endpoint process until ``next_write``, then write the spool (and serve again if no one does);
        the time of the next write."""
        server = self.server
        wait = max(0.0, next_write - time.monotonic())
        if isinstance(server, JobEndpointProcess):
            try:
                gone = not server.answer(wait, self._answer)
            except Exception as error:  # noqa: BLE001
                self.rank.stats.record_error("scrape", error)
                gone = True
            if gone:  # the endpoint process ended: this process or another binds the port again
                server.stop()
                self.server = None
                self._endpoint_ended(server)
        else:
            self._stop.wait(wait)
        if self._stop.is_set() or time.monotonic() < next_write:
            return next_write
        self.rank._write_spool()
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            self._retry_endpoint()
        if self.server is None and (self._own_port is not None or self.node_port and self.rank.claimed):
            # The endpoint process ended, or the process that held the port has gone: serve (again).
            self.serve(first_try=False)
        return time.monotonic() + interval

    def close(self) -> None:
        """Stop serving and free the port (after ``stop_spool_thread``)."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def close_inherited_socket(self) -> None:
        """In a forked child: the endpoint stays the parent's."""
        self._own_port = None
        if self.server is not None:
            self.server.close_inherited_socket()
            self.server = None
