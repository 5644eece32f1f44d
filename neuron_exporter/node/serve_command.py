"""``neuron-exporter serve``: the node daemon, one ``/metrics`` for every rank of the machine.

It reads the spool directory the training ranks write (see deploy/PROTOCOL.md) and never talks to them,
so it can start before or after the job, and restart, without the job noticing.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading

from ..config import (
    ENV_PREFIX,
    NODE_OPTIONS,
    OPTION_TYPES,
    ConfigError,
    Options,
    flag,
    option_help,
    resolve_options,
)
from ..untrusted import EXIT_USAGE
from ..web.http_server import MetricsServer, metrics_server
from .node_view import NodeView
from .spool_dir import Spool
from .spool_expiry import CHECK_INTERVAL_SECONDS, ExpiredFiles

log = logging.getLogger("neuron_exporter")

# option -> flag: the options the node endpoint reads (a config file may hold the others too, for attach())
FLAGS = {key: flag(key) for key in NODE_OPTIONS}
BIND_RETRY_SECONDS = 2.0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve every rank of this machine on one /metrics (the node daemon)",
        description="Serve the metrics of every training rank on this machine, with each rank's liveness and "
        "host metrics, on one /metrics endpoint. Flags override NEURON_EXPORTER_* environment "
        "variables, which override the config file.",
    )
    add_options(parser)
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser, keys=NODE_OPTIONS) -> None:
    """``--config`` and a flag for each option of ``keys``; a boolean's flag alone means true."""
    parser.add_argument("--config", metavar="FILE", help="YAML config file (default: $NEURON_EXPORTER_CONFIG)")
    for key in keys:
        names = [flag(key)] + (["--web-config-file"] if key == "web_config_file" else [])
        default = Options.__dataclass_fields__[key].metadata["shown"] or _shown_default(getattr(Options, key, None))
        text = f"{option_help(key)} (default: {default}; ${ENV_PREFIX}{key.upper()})".replace("`", "").replace(
            "%", "%%"
        )
        if OPTION_TYPES[key] is bool:
            parser.add_argument(*names, dest=key, metavar="BOOL", nargs="?", const="true", help=text)
        else:
            parser.add_argument(*names, dest=key, metavar=_METAVARS.get(key) or _metavar(key), help=text)
    parser.set_defaults(option_keys=tuple(keys))


_METAVARS = {
    "addr": "ADDRESS",
    "port": "PORT",
    "spool_dir": "DIR",
    "spool_mode": "MODE",
    "spool_trusted_users": "USERS",
    "run_id": "ID",
    "instance_id": "ID",
    "web_config_file": "FILE",
    "log_level": "LEVEL",
}


def _metavar(key: str) -> str:
    return key.rsplit("_", 1)[-1].upper() if key.endswith(("_seconds", "_bytes")) else "N"


def _shown_default(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def load_options(args: argparse.Namespace, command: str):
    """(options, web config) from the flags, the environment and the config file; or, on a mistake, the exit code
    after one line on stderr."""
    try:
        options = resolve_options(
            args.config,
            os.environ,
            {key: getattr(args, key) for key in args.option_keys},
            override_name=flag,
        )
        web_config = None
        if options.web_config_file is not None:
            from ..web.web_config import load_web_config

            web_config = load_web_config(options.web_config_file)
    except ConfigError as error:
        print(f"neuron-exporter {command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return options, web_config


def run(args: argparse.Namespace) -> int:
    loaded = load_options(args, "serve")
    if isinstance(loaded, int):
        return loaded
    return serve(*loaded)


def spool_problem(spool: Spool) -> str | None:
    """``spool.prepare()``: the one-line reason why the spool directory is unsafe to read, if it is."""
    try:
        spool.prepare()
    except OSError as error:
        return str(error)
    return None


def node_server(view: NodeView, options: Options, web_config) -> MetricsServer:
    """The node endpoint's server, bound (``OSError`` if the port is taken) but not yet serving."""
    return metrics_server(view.render, view.diagnosis, options.addr, options.port, web_config)


def serve(options: Options, web_config=None) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    spool = Spool.of(options)
    spool_problem(spool)
    view = NodeView(options, spool).start_reading()
    # An unsafe directory is logged now and served as neuron_exporter_spool_directory_ok 0 (its alert fires) until it
    # is fixed: the daemon stays up, so that someone hears of it.
    view.check_directory()
    server = None
    waiting = False
    while server is None and not stop.is_set():
        try:
            server = node_server(view, options, web_config)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                print(
                    f"neuron-exporter serve: cannot listen on {options.addr}:{options.port}: {error.strerror or error}",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            if not waiting:
                # Under attach(), a training rank may hold the port and serve the node view itself.
                log.warning(
                    "port %s is in use (a training rank serving the node view?); retrying every %gs",
                    options.port,
                    BIND_RETRY_SECONDS,
                )
                waiting = True
            stop.wait(BIND_RETRY_SECONDS)
    if server is None:
        return 0
    server.start()
    print(f"neuron-exporter serve: listening on {server.url}", file=sys.stderr, flush=True)
    expired = ExpiredFiles(spool, options.expire_after_seconds)
    expired.remove()
    while not stop.wait(CHECK_INTERVAL_SECONDS):
        expired.remove()
    server.stop()
    return 0
