"""Basic auth that costs a password-guessing client more than it costs the training job it runs in.

- bcrypt runs only for credentials not verified before, and for at most ``BCRYPT_AT_ONCE`` requests at a time in
  the process (requests with the same credentials that wait meanwhile find them verified). Credentials verified
  before are accepted without waiting for bcrypt: the server answers them in the lane of their path, and a request
  that needs bcrypt in a login lane of its own (``waits_for_bcrypt``), so a scraper that logged in keeps scraping
  however many guess, from its address or any other;
- a request waits for bcrypt at most ``BCRYPT_WAIT_SECONDS`` from its arrival, then gets 429 (``BUSY``, retry
  later); a client that has not failed goes to bcrypt before any that has;
- failures are rate limited per client (its address; an IPv6 /64) only: past its limit a client gets 429 at once
  (``LIMITED``), without bcrypt;
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
import time

from .rate_limit import TokenBuckets, client_key
from .web_config import WebConfig

log = logging.getLogger(__name__)

OK, DENIED, LIMITED, BUSY = "ok", "denied", "limited", "busy"
MAX_PASSWORD_BYTES = 72
BCRYPT_AT_ONCE = 1
BCRYPT_WAIT_SECONDS = 2.0  # then 429: a scraper's first login is retried at its next scrape
CLIENT_BURST, CLIENT_REFILL_SECONDS = 10, 6.0  # then one more check every 6 s

# Verified passwords are remembered as an HMAC under a key that lives only in this process, never in clear.
_CACHE_KEY = os.urandom(32)


class BcryptSlots:
    """At most ``BCRYPT_AT_ONCE`` bcrypt checks at a time; a client that has not failed goes before any that has."""

    def __init__(self):
        self._changed = threading.Condition()
        self._running = 0
        self._first_waiting = 0  # clients that have not failed, waiting

    def acquire(self, failed_before: bool, timeout: float) -> bool:
        """Take a slot within ``timeout`` seconds; False if none came by then."""
        with self._changed:
            if failed_before:
                if not self._changed.wait_for(
                    lambda: self._running < BCRYPT_AT_ONCE and not self._first_waiting, max(0.0, timeout)
                ):
                    return False
            else:
                self._first_waiting += 1
                try:
                    took = self._changed.wait_for(lambda: self._running < BCRYPT_AT_ONCE, max(0.0, timeout))
                finally:
                    self._first_waiting -= 1
                if not took:
                    self._changed.notify_all()  # the clients that failed no longer wait for this one
                    return False
            self._running += 1
            return True

    def release(self) -> None:
        with self._changed:
            self._running -= 1
            self._changed.notify_all()


_bcrypt_slots = BcryptSlots()  # process-wide: every endpoint shares the cores


class BasicAuth:
    """Checks ``Authorization`` headers against a ``WebConfig``'s users; one per endpoint (it holds the clients'
    failure limits: a check takes a token, a success gives it back)."""

    def __init__(self):
        self.failures = TokenBuckets(CLIENT_BURST, CLIENT_REFILL_SECONDS)
        self._warned_bad_hash = False

    def waits_for_bcrypt(self, config: WebConfig, header: str | None, client_address: str) -> bool:
        """Whether ``check`` would run bcrypt for this request, and so may wait: credentials well formed and not
        verified before, of a client not past its failure limit."""
        checked = _checked(header)
        return (
            checked is not None
            and not self._verified(config, checked[0], checked[2])
            and self.failures.has_token(client_key(client_address))
        )

    def failed_before(self, client_address: str) -> bool:
        return not self.failures.is_full(client_key(client_address))

    def check(self, config: WebConfig, header: str | None, client_address: str, arrived: float) -> str:
        """OK, DENIED (answer 401), LIMITED (answer 429: too many failures, retry later) or BUSY (answer 429: no
        bcrypt check could be made within ``BCRYPT_WAIT_SECONDS`` of ``arrived``, the monotonic time the request
        came)."""
        checked = _checked(header)
        if checked is None:
            return DENIED
        user, password, digest = checked
        if self._verified(config, user, digest):
            return OK
        client = client_key(client_address)
        if not self.failures.has_token(client):
            return LIMITED
        wait = arrived + BCRYPT_WAIT_SECONDS - time.monotonic()  # past it, its client has waited long enough
        if wait <= 0 or not _bcrypt_slots.acquire(self.failed_before(client), wait):
            return BUSY
        try:
            if self._verified(config, user, digest):  # by a request with the same credentials that went first
                return OK
            if not self.failures.take(client):
                return LIMITED
            hashed = config.users.get(user)
            matched = self._checkpw(password, hashed or config.unknown_user_hash) and hashed is not None
            if matched:
                config.verified[user] = digest  # bounded: one entry per configured user
        finally:
            _bcrypt_slots.release()
        if not matched:
            return DENIED
        self.failures.give_back(client)
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


def _checked(header: str | None) -> tuple[str, bytes, bytes] | None:
    """(user, password, its keyed digest) of a ``Basic`` Authorization header that bcrypt could accept; None if
    there is none, it is malformed or its password is too long."""
    credentials = _credentials(header)
    if credentials is None or len(credentials[1]) > MAX_PASSWORD_BYTES:
        return None
    user, password = credentials
    return user, password, hmac.new(_CACHE_KEY, user.encode() + b"\0" + password, hashlib.sha256).digest()


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
