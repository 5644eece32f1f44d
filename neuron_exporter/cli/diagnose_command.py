"""``neuron-exporter diagnose URL``: what to fix first in a live job, from its endpoint's ``/diagnosis`` page.

URL is a rank's or the node endpoint's address (``http://host:19478``, with or without ``/metrics``). The node
endpoint lists every rank of the machine; each problem names its source line, the ranks it happens on, the user
frames above it and, for recompilations, which upload changed shape.
"""

from __future__ import annotations

import argparse
import base64
import os
import ssl
import sys
from urllib.parse import urlsplit, urlunsplit

from .. import diagnosis
from ..config import PASSWORD_ENV
from ..untrusted import EXIT_USAGE, printable
from .page_fetch import FetchError, fetch


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="list what to fix first in a live job: graph cuts, recompilations, CPU fallbacks by line",
        description="Read the /diagnosis page of a running job's endpoint (a rank's, or the node endpoint with "
        "every rank of the machine) and print its problems, the costliest first, each with its source "
        "line, ranks and what to do.",
    )
    parser.add_argument("url", help="the endpoint, e.g. http://localhost:19478 (a /metrics URL works too)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="for the whole exchange, however slowly the server answers (default 10)",
    )
    parser.add_argument("--cacert", metavar="FILE", help="CA certificate to check an https endpoint with")
    parser.add_argument("--user", metavar="NAME", help=f"basic-auth user; the password is read from ${PASSWORD_ENV}")
    parser.set_defaults(run=run)


def seconds(text: str) -> float:
    value = float(text)  # argparse makes a ValueError one line and exit 2
    if not 0 < value <= 86400:
        raise ValueError(text)
    return value


def diagnosis_url(url: str) -> str:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) address: {url!r:.200}")
    path = parts.path.rstrip("/")
    if path.endswith(("/metrics", "/diagnosis")):
        path = path.rsplit("/", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc, path + "/diagnosis", "format=json", ""))


def _tls_context(cacert: str | None) -> ssl.SSLContext | None:
    if cacert is None:
        return None
    try:
        return ssl.create_default_context(cafile=cacert)
    except OSError as error:  # ssl.SSLError too: not a certificate
        raise ValueError(f"--cacert {cacert}: {error.strerror or error}") from None


def run(args: argparse.Namespace) -> int:
    try:
        url = diagnosis_url(args.url)
        headers = {}
        if args.user is not None:
            token = base64.b64encode(f"{args.user}:{os.environ.get(PASSWORD_ENV, '')}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        context = _tls_context(args.cacert)
        data = fetch(url, args.timeout, diagnosis.MAX_PAGE_BYTES, context, headers)
        document = diagnosis.loads(data, url, diagnosis.MAX_PAGE_BYTES)
    except FetchError as error:
        hint = " (an exporter older than 0.2 has no /diagnosis)" if error.status == 404 else ""
        print(f"neuron-exporter diagnose: {printable(args.url, 200)}: {error}{hint}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError) as error:  # the CA file; the address; the page
        if isinstance(error, OSError) and error.strerror:
            reason = f"{error.filename}: {error.strerror}" if error.filename else error.strerror
        else:
            reason = str(error)
        print(f"neuron-exporter diagnose: {printable(args.url, 200)}: {printable(reason, 300)}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(diagnosis.dumps(document))
    else:
        sys.stdout.write(diagnosis.render_text(document))
    return 0
