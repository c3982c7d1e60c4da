"""Wire protocol of the policy server (version 2): msgpack frames over a websocket, each authenticated by an HMAC
whose key is bound to one connection and one direction. PROTOCOL.md at the repository root is the reference a
third-party client can be written from; this module is the implementation both of our sides use.

A frame is ``tag (32 bytes) + body (msgpack map)``. On connect the server sends an unsigned ``challenge`` with a
fresh random nonce; the client answers with a ``hello`` carrying its own fresh nonce, tagged with
``HMAC(secret, "rlrobot-bridge/2 hello c2s" + server_nonce)``; after that every frame is tagged with a per-connection,
per-direction key ``HMAC(secret, "rlrobot-bridge/2 c2s|s2c" + server_nonce + client_nonce)``. So a frame is valid on
one connection, in one direction; strictly consecutive ``seq`` numbers make it valid once. Without a secret
(``--insecure``, loopback only) every tag is 32 zero bytes and is not checked.

Decoding is bounded: the frame size, every msgpack array / map / str / bin length, the number of containers and the
nesting depth are capped at what the protocol legitimately carries, so no frame can make the receiver allocate or
work much more than its own size. Numpy arrays travel as ``{"__ndarray__": True, "dtype", "shape", "data"}``: no
pickle, no object dtypes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 2
TAG_BYTES = 32
NONCE_BYTES = 32
ZERO_TAG = bytes(TAG_BYTES)
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
HANDSHAKE_MAX_FRAME_BYTES = 64 * 1024
"""frames before authentication (challenge, hello, unsigned errors) are tiny; larger ones close the connection"""
ALLOWED_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8", "|b1")
ERROR_CODES = ("malformed", "unauthenticated", "version", "oversized", "bad_request", "busy", "internal")
KEY_LABEL = b"rlrobot-bridge/2 "
C2S, S2C = "c2s", "s2c"
MAX_ERROR_TEXT = 300


@dataclass(frozen=True)
class DecodeLimits:
    """What one frame may contain; a frame over any limit is refused as ``malformed`` before it is built."""

    max_array_len: int = 64
    """elements of one msgpack array (array shapes, key lists)"""
    max_map_len: int = 64
    """entries of one msgpack map (message fields, observation keys, metadata)"""
    max_str_len: int = 4096
    max_containers: int = 1024
    """maps + arrays in a whole frame"""
    max_depth: int = 8
    """nesting of maps / arrays (a message's metadata is 5 deep)"""
    max_ndim: int = 8
    """dimensions of one __ndarray__"""


LIMITS = DecodeLimits()


class ProtocolError(ValueError):
    """A frame the receiver refuses; ``code`` is one of ERROR_CODES, ``request`` the seq it answers (if known)."""

    def __init__(self, code: str, message: str, request: int | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.request = code, message, request
        self.verified = False
        """True when the frame's tag was checked and good: only then may the answer be signed"""


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def hello_key(secret: bytes | None, server_nonce: bytes) -> bytes | None:
    """Key of the client's hello: binds it to this connection's challenge."""
    return hmac.new(secret, KEY_LABEL + b"hello c2s" + server_nonce, hashlib.sha256).digest() if secret else None


def session_keys(secret: bytes | None, server_nonce: bytes, client_nonce: bytes) -> dict[str, bytes | None]:
    """{"c2s": key, "s2c": key}: one key per direction of one connection (None without a secret)."""
    if not secret:
        return {C2S: None, S2C: None}
    return {d: hmac.new(secret, KEY_LABEL + d.encode() + server_nonce + client_nonce, hashlib.sha256).digest()
            for d in (C2S, S2C)}


def _encode_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        dtype = obj.dtype.newbyteorder("<") if obj.dtype.byteorder == ">" else obj.dtype
        if dtype.str not in ALLOWED_DTYPES:
            raise TypeError(f"arrays of dtype {obj.dtype} cannot be sent; allowed: {ALLOWED_DTYPES}")
        return {"__ndarray__": True, "dtype": dtype.str, "shape": list(obj.shape),
                "data": np.ascontiguousarray(obj, dtype=dtype).tobytes()}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _strict_int(value: Any) -> bool:
    return type(value) is int  # bool is a subclass of int: True must not pass as 1


def _ndarray(obj: dict, limits: DecodeLimits) -> np.ndarray:
    if set(obj) != {"__ndarray__", "dtype", "shape", "data"}:
        raise ProtocolError("malformed", f"an __ndarray__ map has exactly the keys dtype, shape, data; got {sorted(obj)}")
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if dtype not in ALLOWED_DTYPES or not isinstance(shape, list) or not isinstance(data, bytes):
        raise ProtocolError("malformed", f"bad array header (dtype {str(dtype)[:20]!r}; allowed {ALLOWED_DTYPES})")
    if len(shape) > limits.max_ndim or any(not _strict_int(s) or s < 0 for s in shape):
        raise ProtocolError("malformed", f"bad array shape {str(shape)[:80]} (at most {limits.max_ndim} integers >= 0)")
    count = 1
    for s in shape:  # Python integers: no int64 overflow
        count *= s
    expected = count * np.dtype(dtype).itemsize
    if expected != len(data):
        raise ProtocolError("malformed", f"array of shape {shape} and dtype {dtype} needs {expected} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _depth_ok(obj: Any, max_depth: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            items = value.values()
        elif isinstance(value, list):
            items = value
        else:
            continue
        if depth > max_depth:
            return False
        stack.extend((v, depth + 1) for v in items)
    return True


def unpack(body: bytes, limits: DecodeLimits = LIMITS, max_bin_len: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """msgpack -> Python with every length bounded, arrays decoded, the container count and depth checked."""
    containers = 0

    def count() -> None:
        nonlocal containers
        containers += 1
        if containers > limits.max_containers:
            raise ProtocolError("malformed", f"more than {limits.max_containers} maps / arrays in one frame")

    def object_hook(obj: dict) -> Any:
        count()
        if obj.get("__ndarray__") is True:
            return _ndarray(obj, limits)
        return obj

    def list_hook(obj: list) -> list:
        count()
        return obj

    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, use_list=True, object_hook=object_hook,
                                list_hook=list_hook, max_buffer_size=max(len(body), 1),
                                max_array_len=limits.max_array_len, max_map_len=limits.max_map_len,
                                max_str_len=limits.max_str_len, max_bin_len=max_bin_len, max_ext_len=0)
    try:
        unpacker.feed(body)
        message = unpacker.unpack()
        if unpacker.tell() != len(body):
            raise ProtocolError("malformed", f"{len(body) - unpacker.tell()} bytes after the message")
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises many types on garbage or on a limit
        raise ProtocolError("malformed", f"not a msgpack message within the limits ({type(e).__name__}: {str(e)[:80]})") from e
    if not _depth_ok(message, limits.max_depth):
        raise ProtocolError("malformed", f"nesting deeper than {limits.max_depth}")
    return message


def tag(key: bytes | None, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest() if key else ZERO_TAG


def encode(message: dict[str, Any], key: bytes | None) -> bytes:
    body = msgpack.packb(message, default=_encode_default, use_bin_type=True)
    return tag(key, body) + body


def split(frame: bytes | str, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[bytes, bytes]:
    """(tag, body) of a frame of acceptable size."""
    if isinstance(frame, str):
        raise ProtocolError("malformed", "text frames are not accepted; frames are binary msgpack")
    if len(frame) > max_frame_bytes:
        raise ProtocolError("oversized", f"frame of {len(frame)} bytes exceeds the limit of {max_frame_bytes}")
    if len(frame) <= TAG_BYTES:
        raise ProtocolError("malformed", "frame shorter than its authentication tag")
    return bytes(frame[:TAG_BYTES]), bytes(frame[TAG_BYTES:])


def verify(frame_tag: bytes, body: bytes, key: bytes | None) -> None:
    if key and not hmac.compare_digest(frame_tag, tag(key, body)):
        raise ProtocolError("unauthenticated", "bad message authentication tag (wrong or missing token, or a frame "
                                               "from another connection or direction)")


def check_header(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("malformed", "a message is a map with a string 'type'")
    version = message.get("version")
    if not _strict_int(version) or version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"protocol version {str(version)[:20]!r} is not supported; this side speaks "
                                       f"{PROTOCOL_VERSION} (an integer)")
    seq = message.get("seq")
    if not _strict_int(seq) or seq < 0:
        raise ProtocolError("malformed", "a message carries an integer 'seq' >= 0")
    return message


def decode(frame: bytes | str, key: bytes | None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
           limits: DecodeLimits = LIMITS) -> dict[str, Any]:
    """Check size, authenticity (before decoding anything), bounded structure and header of a frame."""
    frame_tag, body = split(frame, max_frame_bytes)
    verify(frame_tag, body, key)
    try:
        return check_header(unpack(body, limits, max_bin_len=max_frame_bytes))
    except ProtocolError as e:
        e.verified = key is not None
        raise


def decode_unsigned(frame: bytes | str, max_frame_bytes: int = HANDSHAKE_MAX_FRAME_BYTES) -> dict[str, Any]:
    """A frame that is not authenticated by design (the challenge, errors to an unauthenticated peer): its tag must
    be zero, and its content is information, never a command."""
    frame_tag, body = split(frame, max_frame_bytes)
    if frame_tag != ZERO_TAG:
        raise ProtocolError("malformed", "an unsigned frame has a zero tag")
    return check_header(unpack(body, LIMITS, max_bin_len=max_frame_bytes))


def message(kind: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "version": PROTOCOL_VERSION, "seq": seq, **fields}


def error(seq: int, code: str, text: str, request: int | None = None) -> dict[str, Any]:
    return message("error", seq, code=code, message=text[:MAX_ERROR_TEXT], request=request)
