"""A token holder flooding the policy server with maximal frames, in its own process (so its CPU and GIL are not the
measuring client's): ``python flood.py URL TOKEN SECONDS MAX_FRAMES FRAME_BYTES``. It authenticates, then sends
signed ``infer`` frames of FRAME_BYTES back to back without waiting for the answers (a thread drains them), until
SECONDS have passed or MAX_FRAMES were sent; it prints ``flooding`` once authenticated and a JSON summary at the end.
Loopback only; bounded in count and time."""

from __future__ import annotations

import collections
import json
import sys
import threading
import time

import msgpack
import numpy as np
import wire  # this file runs as a script: its folder is on sys.path


class FloodFrames:
    """Signed ``infer`` frames of at most ``frame_bytes`` with consecutive seq numbers: a state array the policy
    refuses after the server has received, authenticated and decoded all of it. The body is built once and only its
    seq (a fixed-width uint32) and tag change, so the flooder's own CPU stays small next to the server's."""

    def __init__(self, session: wire.RawSession, frame_bytes: int):
        self.session = session
        state = msgpack.packb({"state": wire.ndarray(np.zeros((1, (frame_bytes - 200) // 4), np.float32))})
        head = b"\x84" + b"".join(msgpack.packb(x) for x in ("type", "infer", "version", wire.VERSION, "seq"))
        self.body = bytearray(head + b"\xce" + bytes(4) + msgpack.packb("obs") + state)
        self.seq_at = len(head) + 1

    def next(self) -> bytes:
        self.session.seq += 1
        self.body[self.seq_at:self.seq_at + 4] = self.session.seq.to_bytes(4, "big")
        return wire.mac(self.session.c2s, self.body) + self.body


def main(url: str, token: str, seconds: float, max_frames: int, frame_bytes: int) -> dict:
    session = wire.RawSession(url, token, timeout=10.0)
    answers: collections.Counter[str] = collections.Counter()  # "signed <code>" of each answer
    closed: list[str] = []

    def drain() -> None:
        try:
            while True:
                reply, signed = wire.parse(session.ws.recv(timeout=seconds + 10), session.s2c)
                answers[f"{'signed' if signed else 'unsigned'} {reply.get('code', reply.get('type'))}"] += 1
        except Exception as e:  # the server closed the connection, or the flood ended
            closed.append(f"{type(e).__name__}: {e}"[:200])

    frames = FloodFrames(session, frame_bytes)
    threading.Thread(target=drain, daemon=True).start()
    print("flooding", flush=True)
    sent, start = 0, time.monotonic()
    try:
        while sent < max_frames and time.monotonic() - start < seconds:
            session.ws.send(frames.next())
            sent += 1
    except Exception as e:
        closed.append(f"send: {type(e).__name__}: {e}"[:200])
    elapsed = time.monotonic() - start
    session.ws.close()
    return {"frames": sent, "bytes": sent * (32 + len(frames.body)), "seconds": round(elapsed, 3), "answers": dict(answers),
            "closed": closed}


if __name__ == "__main__":
    url, token, seconds, max_frames, frame_bytes = sys.argv[1:6]
    print(json.dumps(main(url, token, float(seconds), int(max_frames), int(frame_bytes))), flush=True)
