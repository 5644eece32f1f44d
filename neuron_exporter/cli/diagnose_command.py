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
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from .. import diagnosis
from ..untrusted import EXIT_USAGE

PASSWORD_ENV = "NEURON_EXPORTER_PASSWORD"


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
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--cacert", metavar="FILE", help="CA certificate to check an https endpoint with")
    parser.add_argument("--user", metavar="NAME", help=f"basic-auth user; the password is read from ${PASSWORD_ENV}")
    parser.set_defaults(run=run)


def diagnosis_url(url: str) -> str:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) address: {url!r:.200}")
    path = parts.path.rstrip("/")
    if path.endswith(("/metrics", "/diagnosis")):
        path = path.rsplit("/", 1)[0]
    return urlunsplit((parts.scheme, parts.netloc, path + "/diagnosis", "format=json", ""))


def fetch(url: str, timeout: float, cacert: str | None, user: str | None) -> bytes:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{os.environ.get(PASSWORD_ENV, '')}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=cacert) if cacert else None
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        data = response.read(diagnosis.MAX_PAGE_BYTES + 1)  # what a node endpoint's page holds at most
    if len(data) > diagnosis.MAX_PAGE_BYTES:
        raise ValueError(f"the answer is larger than a diagnosis page ({diagnosis.MAX_PAGE_BYTES} bytes)")
    return data


def run(args: argparse.Namespace) -> int:
    try:
        url = diagnosis_url(args.url)
        data = fetch(url, args.timeout, args.cacert, args.user)
        document = diagnosis.loads(data, url, diagnosis.MAX_PAGE_BYTES)
    except urllib.error.HTTPError as error:
        hint = " (an exporter older than 0.2 has no /diagnosis)" if error.code == 404 else ""
        print(f"neuron-exporter diagnose: {args.url}: HTTP {error.code} {error.reason}{hint}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, ssl.SSLError) as error:
        reason = getattr(error, "reason", None) or error
        print(f"neuron-exporter diagnose: {args.url!s:.200}: {str(reason)[:300]}", file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print(diagnosis.dumps(document))
    else:
        sys.stdout.write(diagnosis.render_text(document))
    return 0
