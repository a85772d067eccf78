"""Canonical session-config fingerprints.

A fingerprint is ``"sha256:" + hex`` over a type-tagged, length-prefixed encoding of a driver
config.  Anything that cannot be encoded stably fails closed with
``SessionConfigFingerprintError``, whose fields name positions and field names only — never a
value or a dict key.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import struct
from collections.abc import Mapping
from typing import Any

from adaptor.driver._errors import SessionConfigFingerprintError

_PREFIX = b"adaptor/session-config/v1"


def canonical_fingerprint(domain: str, value: Any, *, root: str = "Config") -> str:
    """The stable fingerprint of ``value`` under ``domain`` (e.g. ``claude/config/v1``)."""
    out = bytearray()
    _put_bytes(out, _PREFIX)
    _put_bytes(out, domain.encode())
    _Encoder(out).encode(value, root, frozenset())
    return "sha256:" + hashlib.sha256(out).hexdigest()


def _put_bytes(out: bytearray, data: bytes) -> None:
    out += struct.pack(">Q", len(data))
    out += data


class _Encoder:
    def __init__(self, out: bytearray) -> None:
        self.out = out

    def fail(self, path: str, value: Any, kind: str, why: str) -> SessionConfigFingerprintError:
        return SessionConfigFingerprintError(path, type(value).__qualname__, kind, why)

    def tag(self, name: str) -> None:
        _put_bytes(self.out, name.encode())

    def encode(self, value: Any, path: str, active: frozenset[int]) -> None:
        if value is None:
            self.tag("none")
        elif isinstance(value, bool):
            self.tag("bool")
            self.out += b"1" if value else b"0"
        elif isinstance(value, enum.Enum):
            self.tag("enum:" + type(value).__qualname__)
            self.encode(value.value, path, active)
        elif isinstance(value, int):
            self.tag("int")
            _put_bytes(self.out, str(value).encode())
        elif isinstance(value, float):
            if math.isnan(value):
                raise self.fail(path, value, "float", "NaN has no stable identity")
            self.tag("float")
            self.out += struct.pack(">d", value)
        elif isinstance(value, str):
            self.tag("str")
            _put_bytes(self.out, value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, bytes | bytearray):
            self.tag("bytes")
            _put_bytes(self.out, bytes(value))
        elif callable(value) and not dataclasses.is_dataclass(value):
            raise self.fail(path, value, "callable", "functions have no stable encoding")
        else:
            self.encode_container(value, path, active)

    def encode_container(self, value: Any, path: str, active: frozenset[int]) -> None:
        if id(value) in active:
            raise self.fail(path, value, "cycle", "the value contains itself")
        active = active | {id(value)}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            self.tag("struct:" + type(value).__qualname__)
            fields = dataclasses.fields(value)
            self.out += struct.pack(">Q", len(fields))
            for f in fields:
                self.tag(f.name)
                self.encode(getattr(value, f.name), f"{path}.{f.name}", active)
        elif isinstance(value, Mapping):
            self.tag("map")
            entries: list[tuple[bytes, bytes]] = []
            for key, item in value.items():
                if not isinstance(key, str | int) or isinstance(key, bool):
                    raise self.fail(path + "{}", key, "map key", "keys must be strings or ints")
                key_bytes = bytearray()
                _Encoder(key_bytes).encode(key, path + "{}", active)
                item_bytes = bytearray()
                _Encoder(item_bytes).encode(item, path + "{}", active)
                entries.append((bytes(key_bytes), bytes(item_bytes)))
            entries.sort()
            self.out += struct.pack(">Q", len(entries))
            for encoded_key, encoded_item in entries:
                self.out += encoded_key + encoded_item
        elif isinstance(value, list | tuple):
            # None, [] and () are distinct values but an empty list and tuple are the same config.
            self.tag("seq")
            self.out += struct.pack(">Q", len(value))
            for index, item in enumerate(value):
                self.encode(item, f"{path}[{index}]", active)
        elif isinstance(value, set | frozenset):
            encoded: list[bytes] = []
            for item in value:
                item_bytes = bytearray()
                _Encoder(item_bytes).encode(item, path + "{}", active)
                encoded.append(bytes(item_bytes))
            self.tag("set")
            self.out += struct.pack(">Q", len(encoded))
            for encoded_item in sorted(encoded):
                self.out += encoded_item
        else:
            raise self.fail(path, value, "object", "objects without declared fields are not encodable")
