"""Basic auth that costs a password-guessing client more than it costs the training job it runs in.

- bcrypt runs only for credentials not verified before, and for at most ``BCRYPT_AT_ONCE`` requests at a time in
  the process (requests with the same credentials that wait meanwhile find them verified);
- failures are rate limited per client (its address; an IPv6 /64) only: past its limit a client gets 429 at once,
  without bcrypt, and a client that has not failed is never refused, however many others guess. It also goes
  first to bcrypt and waits for its turn as long as that takes (the server's workers bound the queue), where a
  client that failed gives up after ``BCRYPT_WAIT_SECONDS``. Credentials verified before are still accepted, so a
  scraper that logged in keeps scraping while someone else guesses from its address;
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

# Verified passwords are remembered as an HMAC under a key that lives only in this process, never in clear.
_CACHE_KEY = os.urandom(32)


class BcryptSlots:
    """At most ``BCRYPT_AT_ONCE`` bcrypt checks at a time; a client that has not failed goes before any that has."""

    def __init__(self):
        self._changed = threading.Condition()
        self._running = 0
        self._first_waiting = 0  # clients that have not failed, waiting

    def acquire(self, failed_before: bool) -> bool:
        with self._changed:
            if failed_before:
                if not self._changed.wait_for(
                    lambda: self._running < BCRYPT_AT_ONCE and not self._first_waiting, BCRYPT_WAIT_SECONDS
                ):
                    return False
            else:
                self._first_waiting += 1
                try:
                    self._changed.wait_for(lambda: self._running < BCRYPT_AT_ONCE)
                finally:
                    self._first_waiting -= 1
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
        if not self.failures.has_token(client):
            return LIMITED
        if not _bcrypt_slots.acquire(failed_before=not self.failures.is_full(client)):
            return LIMITED
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
