"""Wire protocol: explicit array encoding, HMAC authentication, version and size checks."""

import msgpack
import numpy as np
import pytest

from rlrobot.real_robot import protocol
from rlrobot.real_robot.protocol import ProtocolError, decode, encode, message

SECRET = b"s3cret"


def test_round_trip_keeps_arrays_exact():
    obs = {"state": np.arange(6, dtype=np.float32).reshape(2, 3), "image": np.full((4, 4, 3), 7, np.uint8),
           "flag": np.array([True, False])}
    out = decode(encode(message("infer", 1, obs=obs), SECRET), SECRET)
    assert out["type"] == "infer" and out["seq"] == 1
    for k, v in obs.items():
        assert out["obs"][k].dtype == v.dtype and np.array_equal(out["obs"][k], v)


def test_wrong_or_missing_token_is_rejected():
    frame = encode(message("hello", 1), b"other")
    with pytest.raises(ProtocolError) as e:
        decode(frame, SECRET)
    assert e.value.code == "unauthenticated"
    with pytest.raises(ProtocolError, match="unauthenticated"):
        decode(encode(message("hello", 1), None), SECRET)
    tampered = bytearray(encode(message("infer", 1, obs={"x": np.zeros(2, np.float32)}), SECRET))
    tampered[-1] ^= 1
    with pytest.raises(ProtocolError, match="unauthenticated"):
        decode(bytes(tampered), SECRET)


def test_version_malformed_and_oversized_frames():
    old = encode({"type": "hello", "version": 0, "seq": 1}, SECRET)
    with pytest.raises(ProtocolError) as e:
        decode(old, SECRET)
    assert e.value.code == "version"
    for garbage in (b"\x00" * 40, bytes(32) + b"\xc1\xc1", bytes(32) + msgpack.packb([1, 2])):
        with pytest.raises(ProtocolError) as e:
            decode(garbage, None)
        assert e.value.code == "malformed"
    with pytest.raises(ProtocolError, match="malformed"):
        decode("text frame", None)
    big = encode(message("infer", 1, obs={"x": np.zeros(1000, np.float32)}), None)
    with pytest.raises(ProtocolError) as e:
        decode(big, None, max_frame_bytes=1000)
    assert e.value.code == "oversized"


def test_array_headers_are_checked_and_objects_refused():
    bad = {"type": "infer", "version": protocol.PROTOCOL_VERSION, "seq": 1,
           "obs": {"__ndarray__": True, "dtype": "<f4", "shape": [10], "data": b"\x00" * 8}}
    with pytest.raises(ProtocolError, match="needs 40 bytes"):
        decode(bytes(32) + msgpack.packb(bad, use_bin_type=True), None)
    bad["obs"]["dtype"] = "|O"
    with pytest.raises(ProtocolError, match="bad array header"):
        decode(bytes(32) + msgpack.packb(bad, use_bin_type=True), None)
    with pytest.raises(TypeError, match="cannot be sent"):
        encode(message("infer", 1, obs=np.array([object()])), None)
