"""A seeded mutator for the fuzz tests: every input parser is fed mutations of real, valid inputs.

``make test`` runs ``FUZZ_CASES`` cases per target (a few thousand in all); ``make fuzz`` sets
``NEURON_EXPORTER_FUZZ_CASES`` much higher. Every case is reproducible from its seed, which a failing
assertion should print.
"""

from __future__ import annotations

import os
import random

FUZZ_CASES = int(os.environ.get("NEURON_EXPORTER_FUZZ_CASES", "600"))

# Values that broke parsers before, or are known to break naive ones.
NASTY = [
    b"",
    b"\x00",
    b"\xff\xfe",
    b"\xef\xbb\xbf",
    b"\x1b[31m",
    b"\r\n",
    b"\n" * 3,
    b"-1",
    b"-0",
    b"1e400",
    b"nan",
    b"inf",
    b"-inf",
    b"9" * 5000,
    b"18446744073709551616",
    b"0x10",
    b"1_000",
    b"\xe2\x80\xae",
    b"\t",
    b"{",
    b"}",
    b"[" * 2000,
    b"]",
    b'"',
    b"'",
    b"\\",
    b":",
    b"#",
    b"&a",
    b"*a",
    b"!!python/object:os.system",
    b"%",
    b"~",
    b"null",
    b"true",
    b"\xc3\x28",
    b"\xed\xa0\x80",
    "\u2028".encode(),
    b" " * 300,
]


def mutate(data: bytes, rng: random.Random, rounds: int | None = None) -> bytes:
    """``data`` after 1 to 4 random edits: byte flips, cut, duplicated or swapped spans, nasty values, digits."""
    data = bytearray(data)
    for _ in range(rounds or rng.randint(1, 4)):
        kind = rng.randrange(8)
        at = rng.randint(0, len(data))
        end = min(len(data), at + rng.randint(0, 64))
        if kind == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            del data[at:end]
        elif kind == 2:
            data[at:at] = data[at:end] * rng.randint(1, 50)
        elif kind == 3:
            data[at:end] = rng.choice(NASTY)
        elif kind == 4:  # a number where a number was: the same shape, another size or sign
            data[at:end] = rng.choice([b"-", b"", b"1" * rng.randint(1, 400), b".", b"e99", b"e-99"]) + bytes(
                rng.choice(b"0123456789") for _ in range(rng.randint(1, 30))
            )
        elif kind == 5:
            data = data[:at]  # truncated
        elif kind == 6 and data:
            other = rng.randint(0, len(data))
            data[at:end], data[other:other] = b"", data[at:end]
        else:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(data)


def cases(seeds: list[bytes], name: str, count: int = FUZZ_CASES):
    """(case seed, mutated input) pairs, reproducible: ``name`` and the index make the seed."""
    for index in range(count):
        case_seed = f"{name}:{index}"
        rng = random.Random(case_seed)
        yield case_seed, mutate(rng.choice(seeds), rng)
