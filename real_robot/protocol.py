"""Wire protocol of the policy server: msgpack frames over a websocket, each authenticated by an HMAC.

A frame is ``tag (32 bytes, HMAC-SHA256 of the body with the shared secret) + body (msgpack)``. Without a secret
(``--insecure``, loopback only) the tag is 32 zero bytes and is not checked. Numpy arrays are encoded explicitly as
``{"__ndarray__": True, "dtype": "<f4", "shape": [...], "data": bytes}``: no pickle, no object dtypes, so a frame
can never execute code on the receiver.

Messages (``type`` field), all carrying the protocol ``version`` and a per-connection increasing ``seq``:
- client ``hello`` -> server ``hello`` with the policy's metadata (spaces, chunk size, control rate, ...);
- client ``infer`` {obs} -> server ``action`` {actions [chunk, action_dim], inference_s};
- client ``stats`` -> server ``stats`` (latency percentiles);
- server ``error`` {code, message} for anything it rejects; the connection (and the server) stay up.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1
TAG_BYTES = 32
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
ALLOWED_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<i4", "<i8", "<f2", "<f4", "<f8", "|b1")
ERROR_CODES = ("malformed", "unauthenticated", "version", "oversized", "bad_request", "internal")


class ProtocolError(Exception):
    """A frame the receiver refuses; ``code`` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


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


def _decode_hook(obj: dict) -> Any:
    if obj.get("__ndarray__") is True:
        dtype, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
        if dtype not in ALLOWED_DTYPES or not isinstance(shape, list) or not isinstance(data, bytes):
            raise ProtocolError("malformed", f"bad array header (dtype {dtype!r})")
        if any(not isinstance(s, int) or s < 0 for s in shape):
            raise ProtocolError("malformed", f"bad array shape {shape!r}")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if expected != len(data):
            raise ProtocolError("malformed", f"array of shape {shape} and dtype {dtype} needs {expected} bytes, got {len(data)}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    return obj


def _tag(secret: bytes | None, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).digest() if secret else bytes(TAG_BYTES)


def encode(message: dict[str, Any], secret: bytes | None) -> bytes:
    body = msgpack.packb(message, default=_encode_default, use_bin_type=True)
    return _tag(secret, body) + body


def decode(frame: bytes | str, secret: bytes | None, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> dict[str, Any]:
    """Check size, authenticity, shape and version of a frame; raise ProtocolError naming what is wrong."""
    if isinstance(frame, str):
        raise ProtocolError("malformed", "text frames are not accepted; frames are binary msgpack")
    if len(frame) > max_frame_bytes:
        raise ProtocolError("oversized", f"frame of {len(frame)} bytes exceeds the limit of {max_frame_bytes}")
    if len(frame) <= TAG_BYTES:
        raise ProtocolError("malformed", "frame shorter than its authentication tag")
    tag, body = frame[:TAG_BYTES], frame[TAG_BYTES:]
    if secret and not hmac.compare_digest(tag, _tag(secret, body)):
        raise ProtocolError("unauthenticated", "bad message authentication tag (wrong or missing token)")
    try:
        message = msgpack.unpackb(body, object_hook=_decode_hook, raw=False, max_bin_len=max_frame_bytes,
                                  strict_map_key=True)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises many types on garbage
        raise ProtocolError("malformed", f"not a msgpack message ({type(e).__name__})") from e
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("malformed", "a message is a map with a string 'type'")
    if message.get("version") != PROTOCOL_VERSION:
        raise ProtocolError("version", f"protocol version {message.get('version')!r} is not supported; this side "
                                       f"speaks {PROTOCOL_VERSION}")
    if not isinstance(message.get("seq"), int):
        raise ProtocolError("malformed", "a message carries an integer 'seq'")
    return message


def message(kind: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "version": PROTOCOL_VERSION, "seq": seq, **fields}


def error(seq: int, code: str, text: str) -> dict[str, Any]:
    return message("error", seq, code=code, message=text)
