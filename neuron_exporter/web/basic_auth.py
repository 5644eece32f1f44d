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
import logging
import os
import threading

from .rate_limit import TokenBuckets, client_key
from .web_config import WebConfig

log = logging.getLogger(__name__)

OK, DENIED, LIMITED = "ok", "denied", "limited"
MAX_PASSWORD_BYTES = 72
BCRYPT_AT_ONCE = 1
BCRYPT_WAIT_SECONDS = 5.0
CLIENT_BURST, CLIENT_REFILL_SECONDS = 10, 6.0  # then one more check every 6 s
ENDPOINT_BURST, ENDPOINT_REFILL_SECONDS = 20, 2.0  # bounds many clients together (IPv6 gives one many addresses)

_bcrypt_slots = threading.BoundedSemaphore(BCRYPT_AT_ONCE)  # process-wide: every endpoint shares the cores
# Verified passwords are remembered as an HMAC under a key that lives only in this process, never in clear.
_CACHE_KEY = os.urandom(32)


class FailureLimiter:
    """Password checks that may fail, per client and for the endpoint. A check takes a token from both buckets; a
    check that succeeds gives them back, so only failures count."""

    def __init__(self):
        self.clients = TokenBuckets(CLIENT_BURST, CLIENT_REFILL_SECONDS)
        self.endpoint = TokenBuckets(ENDPOINT_BURST, ENDPOINT_REFILL_SECONDS)

    def allows(self, client: str) -> bool:
        """Whether ``take`` could succeed now; takes nothing."""
        return self.clients.has_token(client) and self.endpoint.has_token("")

    def take(self, client: str) -> bool:
        if not self.clients.take(client):
            return False
        if not self.endpoint.take(""):
            self.clients.give_back(client)
            return False
        return True

    def give_back(self, client: str) -> None:
        self.clients.give_back(client)
        self.endpoint.give_back("")


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
