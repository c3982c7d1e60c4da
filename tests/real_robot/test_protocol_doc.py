"""Issue 14, item 14: PROTOCOL.md is a reference a client can be written from; its example frames are valid."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rlrobot.real_robot import protocol

from . import wire

DOC = (Path(__file__).resolve().parents[2] / "PROTOCOL.md").read_text()
FRAMES = re.findall(r"```frame (\w+) (\w+)\n(.*?)```\s*```json\n(.*?)```", DOC, re.S)


def expected(value):
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, dict) and set(value) == {"ndarray"}:
        a = value["ndarray"]
        return np.asarray(a["values"], dtype=a["dtype"]).reshape(a["shape"])
    if isinstance(value, dict):
        return {k: expected(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expected(v) for v in value]
    return value


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def doc_keys():
    token = re.search(r"Token `([^`]+)`", DOC).group(1).encode()
    server_nonce, client_nonce = bytes(range(32)), bytes(range(32, 64))
    k_hello = wire.hello_key(token, server_nonce)
    c2s, s2c = wire.session_keys(token, server_nonce, client_nonce)
    for name, key in (("K_hello", k_hello), ("K_c2s", c2s), ("K_s2c", s2c)):  # the doc's keys, recomputed
        assert re.search(rf"{name} *= ([0-9a-f]{{64}})", DOC).group(1) == key.hex(), name
    return {"unsigned": None, "hello": k_hello, "c2s": c2s, "s2c": s2c}


def test_the_doc_has_every_message_of_a_session():
    assert [name for name, *_ in FRAMES] == ["challenge", "hello", "hello_reply", "infer", "action", "error"]


@pytest.mark.parametrize("name, key_name, hex_text, body", FRAMES, ids=[f[0] for f in FRAMES])
def test_example_frames_are_valid(name, key_name, hex_text, body):
    keys = doc_keys()
    frame = bytes.fromhex("".join(hex_text.split()))
    key = keys[key_name]
    # independently: the tag is HMAC-SHA256 of the body with the named key (zero for unsigned frames)
    assert frame[:32] == wire.mac(key, frame[32:])
    # our decoder accepts it with that key and reads exactly the documented content
    message = protocol.decode_unsigned(frame) if key is None else protocol.decode(frame, key)
    assert same(message, expected(json.loads(body))), (message, body)
    if key is not None:  # and refuses it with any other key: another direction or connection
        for other in keys.values():
            if other is not None and other != key:
                with pytest.raises(protocol.ProtocolError, match="unauthenticated"):
                    protocol.decode(frame, other)


def test_documented_limits_are_the_implemented_ones():
    limits = protocol.LIMITS
    assert f"| msgpack array / map length | {limits.max_array_len} entries" in DOC and limits.max_map_len == limits.max_array_len
    assert f"| msgpack str length | {limits.max_str_len} bytes" in DOC
    assert f"| maps + arrays per frame | {limits.max_containers} |" in DOC
    assert f"| nesting depth | {limits.max_depth} |" in DOC and f"| array dimensions | {limits.max_ndim} |" in DOC
    assert protocol.HANDSHAKE_MAX_FRAME_BYTES == 64 * 1024 and protocol.DEFAULT_MAX_FRAME_BYTES == 8 * 1024 * 1024
    assert " ".join(protocol.ALLOWED_DTYPES) in DOC
    for code in protocol.ERROR_CODES:
        assert f"`{code}`" in DOC


def test_documented_byte_budgets_are_the_serve_defaults():
    from rlrobot.real_robot.server import ServeArgs

    mib = 1024 * 1024
    assert ServeArgs.byte_burst % mib == 0 and ServeArgs.byte_rate % mib == 0
    burst, rate = ServeArgs.byte_burst // mib, ServeArgs.byte_rate // mib
    assert f"`--byte-burst` ({burst} MiB) at once, then `--byte-rate` ({rate} MiB/s)" in DOC
    assert f"`--budget-close-s` ({ServeArgs.budget_close_s:g} s)" in DOC and "`over its byte budget`" in DOC
    for field in ("bytes_in", "budget_waits", "closed_over_budget"):
        assert f"`{field}`" in DOC
