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


def test_version_and_seq_types_are_strict():
    """Issue 14 item 5: 2.0 / True as the version and True as the seq are refused (bool is an int in Python)."""
    for version in (2.0, True, "2", None):
        with pytest.raises(ProtocolError) as e:
            decode(encode({"type": "hello", "version": version, "seq": 1}, SECRET), SECRET)
        assert e.value.code == "version"
    for seq in (True, 1.0, -1, None):
        with pytest.raises(ProtocolError, match="integer 'seq'"):
            decode(encode({"type": "hello", "version": protocol.PROTOCOL_VERSION, "seq": seq}, SECRET), SECRET)


def test_decoder_limits_refuse_bombs_before_building_them():
    """Issue 14 item 3 at the unit level: every length, the container count and the depth are capped."""
    head = {"type": "infer", "version": protocol.PROTOCOL_VERSION, "seq": 1}
    cases = {
        "max_array_len": msgpack.packb({**head, "obs": [0] * 65}),
        "max_map_len": msgpack.packb({**head, "obs": {f"k{i}": 0 for i in range(65)}}),
        "max_str_len": msgpack.packb({**head, "obs": "x" * 5000}),
        "maps / arrays": msgpack.packb({**head, "obs": [[[] for _ in range(40)] for _ in range(40)]}),
        "deeper than": msgpack.packb({**head, "obs": [[[[[[[[[0]]]]]]]]]}),
        "max_ext_len": msgpack.packb({**head, "obs": msgpack.ExtType(1, b"x")}),
        "at most 8": msgpack.packb({**head, "obs": {"__ndarray__": True, "dtype": "<f4", "shape": [1] * 9,
                                                    "data": bytes(4)}}),
        "exactly the keys": msgpack.packb({**head, "obs": {"__ndarray__": True, "dtype": "<f4", "shape": [1],
                                                           "data": bytes(4), "extra": 1}}),
        "bytes after": msgpack.packb(head) + b"\x00",
    }
    for what, body in cases.items():
        with pytest.raises(ProtocolError, match="malformed") as e:
            decode(protocol.tag(SECRET, body) + body, SECRET)
        assert what in e.value.message, (what, e.value.message)
    shape = {**head, "obs": {"__ndarray__": True, "dtype": "<f4", "shape": [2**62, 4, 0], "data": b""}}
    with pytest.raises(ProtocolError, match="malformed"):  # exact arithmetic (no int64 wrap-around), then refused
        decode(encode(shape, SECRET), SECRET)
