"""Basic auth that costs a password-guessing client more than it costs the training job it runs in.

- bcrypt runs only for credentials not verified before, and for at most ``BCRYPT_AT_ONCE`` requests at a time in
  the process (requests with the same credentials that wait meanwhile find them verified);
- checks that may fail are rate limited per client (its address; an IPv6 /64) and for the whole endpoint: past the
  limit a request gets 429 at once, without bcrypt. Credentials verified before are still accepted, so a scraper
  that logged in keeps scraping while someone else guesses from its address;
- a user that does not exist costs a bcrypt check at the configured users' own cost, like a wrong password;
- a password over 72 bytes (bcrypt's limit: it can match no hash) is refused at once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import threading
import time
from collections import OrderedDict

from .web_config import WebConfig

log = logging.getLogger(__name__)

OK, DENIED, LIMITED = "ok", "denied", "limited"
MAX_PASSWORD_BYTES = 72
BCRYPT_AT_ONCE = 1
BCRYPT_WAIT_SECONDS = 5.0
CLIENT_BURST, CLIENT_REFILL_SECONDS = 10, 6.0  # then one more check every 6 s
ENDPOINT_BURST, ENDPOINT_REFILL_SECONDS = 20, 2.0  # bounds many clients together (IPv6 gives one many addresses)
MAX_CLIENTS = 4096

_bcrypt_slots = threading.BoundedSemaphore(BCRYPT_AT_ONCE)  # process-wide: every endpoint shares the cores
# Verified passwords are remembered as an HMAC under a key that lives only in this process, never in clear.
_CACHE_KEY = os.urandom(32)


class FailureLimiter:
    """Token buckets of password checks: one per client (the least recently seen are forgotten past
    ``MAX_CLIENTS``) and one for the endpoint. A check takes a token from both; a check that succeeds gives them
    back, so only failures count."""

    def __init__(self):
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, list[float]] = OrderedDict()  # client -> [tokens, when last refilled]
        self._endpoint = [float(ENDPOINT_BURST), time.monotonic()]

    def allows(self, client: str) -> bool:
        """Whether ``take`` could succeed now; takes nothing."""
        now = time.monotonic()
        with self._lock:
            bucket = self._clients.get(client)
            return ((bucket is None or bucket[0] + (now - bucket[1]) / CLIENT_REFILL_SECONDS >= 1)
                    and self._endpoint[0] + (now - self._endpoint[1]) / ENDPOINT_REFILL_SECONDS >= 1)

    def take(self, client: str) -> bool:
        now = time.monotonic()
        with self._lock:
            bucket = self._clients.pop(client, None) or [float(CLIENT_BURST), now]
            self._clients[client] = bucket
            if len(self._clients) > MAX_CLIENTS:
                self._clients.popitem(last=False)
            if not _refill(bucket, CLIENT_BURST, CLIENT_REFILL_SECONDS, now):
                return False
            if not _refill(self._endpoint, ENDPOINT_BURST, ENDPOINT_REFILL_SECONDS, now):
                bucket[0] += 1
                return False
            bucket[0] -= 1
            self._endpoint[0] -= 1
            return True

    def give_back(self, client: str) -> None:
        with self._lock:
            bucket = self._clients.get(client)
            if bucket is not None:
                bucket[0] = min(bucket[0] + 1, CLIENT_BURST)
            self._endpoint[0] = min(self._endpoint[0] + 1, ENDPOINT_BURST)


def _refill(bucket: list[float], burst: int, refill_seconds: float, now: float) -> bool:
    """Refill ``bucket`` for the time since its last refill; True if it holds a whole token."""
    bucket[0] = min(float(burst), bucket[0] + (now - bucket[1]) / refill_seconds)
    bucket[1] = now
    return bucket[0] >= 1


def client_key(address: str) -> str:
    """The rate-limited unit for a client address: the address, or its /64 for IPv6 (one host's usual share)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False))


class BasicAuth:
    """Checks ``Authorization`` headers against a ``WebConfig``'s users; one per endpoint (it holds the limiter)."""

    def __init__(self):
        self.limiter = FailureLimiter()
        self._warned_bad_hash = False

    def check(self, config: WebConfig, header: str | None, client_address: str) -> str:
        """OK, DENIED (answer 401) or LIMITED (answer 429: too many failures, retry later)."""
        credentials = _credentials(header)
        if credentials is None:
            return DENIED
        user, password = credentials
        if len(password) > MAX_PASSWORD_BYTES:
            return DENIED
        digest = hmac.new(_CACHE_KEY, user.encode() + b"\0" + password, hashlib.sha256).digest()
        if self._verified(config, user, digest):
            return OK
        client = client_key(client_address)
        if not self.limiter.allows(client):
            return LIMITED
        if not _bcrypt_slots.acquire(timeout=BCRYPT_WAIT_SECONDS):
            return LIMITED
        try:
            if self._verified(config, user, digest):  # by a request with the same credentials that went first
                return OK
            if not self.limiter.take(client):
                return LIMITED
            hashed = config.users.get(user)
            matched = self._checkpw(password, hashed or config.unknown_user_hash) and hashed is not None
            if matched:
                config.verified[user] = digest  # bounded: one entry per configured user
        finally:
            _bcrypt_slots.release()
        if not matched:
            return DENIED
        self.limiter.give_back(client)
        return OK

    @staticmethod
    def _verified(config: WebConfig, user: str, digest: bytes) -> bool:
        known = config.verified.get(user)
        return known is not None and hmac.compare_digest(known, digest)

    def _checkpw(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt
        try:
            return bcrypt.checkpw(password, hashed)
        except ValueError as error:  # load_web_config checks every hash, so this is a bug: say so once
            if not self._warned_bad_hash:
                self._warned_bad_hash = True
                log.warning("basic auth: bcrypt refused a configured hash: %s", error)
            return False


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) of a ``Basic`` Authorization header; None if there is none or it is malformed."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        user, colon, password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")
        if not colon:
            return None
        return user.decode(), password
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
