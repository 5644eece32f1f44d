"""The EC2 instance a process runs on: the ``instance_id`` label neuron-monitor puts on every series, which joins
the rank's series to its devices' (``device_join``).

In order: the ``instance_id`` option (``NEURON_EXPORTER_INSTANCE_ID``); else, on a thread of its own, so that
neither start-up nor a step waits for it, the Nitro DMI file (no network call), then the instance metadata service
(IMDSv2: a token first; ``TIMEOUT_SECONDS`` per request, no proxy). The metadata service is where the AWS SDKs look
for it: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` moves it, ``AWS_EC2_METADATA_DISABLED=true`` turns it off. Found by
none of them (not EC2; a container whose hop limit keeps the metadata service out and that has no /sys): absent,
never guessed.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from ..untrusted import quoted

log = logging.getLogger("neuron_exporter")

DMI_ASSET_TAG = Path("/sys/devices/virtual/dmi/id/board_asset_tag")
METADATA_ENDPOINT = "http://169.254.169.254"
ENDPOINT_ENV = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
DISABLED_ENV = "AWS_EC2_METADATA_DISABLED"
TIMEOUT_SECONDS = 1.0
TOKEN_TTL = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
MAX_READ = 256  # bytes of an answer read: an id is 19, a token 56


def _instance_id(data: bytes) -> str | None:
    """``data`` as an instance id, if it is one (a DMI asset tag on another machine is anything, or nothing)."""
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return text if INSTANCE_ID.fullmatch(text) else None


def from_dmi(path: Path = DMI_ASSET_TAG) -> str | None:
    """The instance id a Nitro instance writes in its DMI board asset tag; None if the file is absent, unreadable
    or holds something else."""
    try:
        with open(path, "rb") as file:
            return _instance_id(file.read(MAX_READ))
    except OSError:
        return None


def metadata_endpoint(env: Mapping[str, str]) -> str | None:
    """The metadata service's URL, or None when it is turned off or its variable is not a URL (said once)."""
    if env.get(DISABLED_ENV, "").strip().lower() == "true":
        return None
    endpoint = env.get(ENDPOINT_ENV, "").strip() or METADATA_ENDPOINT
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        log.warning(
            "neuron-exporter: %s=%s is not an http:// or https:// URL: the instance id is not looked up there",
            ENDPOINT_ENV,
            quoted(endpoint),
        )
        return None
    return endpoint.rstrip("/")


def from_metadata_service(endpoint: str, timeout: float) -> str | None:
    """The instance id from the metadata service at ``endpoint`` (IMDSv2); None if it does not answer with one."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP proxy
    token_request = urllib.request.Request(f"{endpoint}/latest/api/token", method="PUT", headers=TOKEN_TTL)
    try:
        with opener.open(token_request, timeout=timeout) as response:
            token = response.read(MAX_READ).decode("ascii").strip()
        id_request = urllib.request.Request(
            f"{endpoint}/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        )
        with opener.open(id_request, timeout=timeout) as response:
            return _instance_id(response.read(MAX_READ))
    except (OSError, ValueError, http.client.HTTPException):  # refused, timed out, an error status, not ASCII
        return None


class InstanceIdLookup:
    """The instance id, found once: ``given`` (the option), or looked up on a daemon thread that ``start()`` starts
    and does not wait for. ``value`` is None until ``done``, and after it where none was found."""

    def __init__(
        self,
        given: str | None,
        on_error: Callable[[BaseException], None],
        dmi_path: Path | None = None,
        env: Mapping[str, str] = os.environ,
    ):
        self.value = given
        self._on_error = on_error
        self._dmi_path = dmi_path
        self._env = env
        self._done = threading.Event()
        self._started = False
        if given:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def start(self) -> None:
        if self.done or self._started:
            return
        self._started = True
        threading.Thread(target=self._look_up, name="neuron-exporter-instance-id", daemon=True).start()

    def after_fork_in_child(self) -> None:
        """A forked child has no copy of the thread: one still looking is started again there."""
        self._started = False
        self.start()

    def _look_up(self) -> None:
        try:
            found = from_dmi(self._dmi_path or DMI_ASSET_TAG)
            if found is None:
                endpoint = metadata_endpoint(self._env)
                found = from_metadata_service(endpoint, TIMEOUT_SECONDS) if endpoint else None
            self.value = found
        except Exception as error:  # noqa: BLE001 (a thread of the exporter's never ends a training job)
            self._on_error(error)
        finally:
            self._done.set()
