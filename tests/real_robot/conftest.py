"""Fixtures: real checkpoints built without training, and a real policy server process on loopback."""

import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
import torch

import rlrobot
from rlrobot.checkpoints import save_checkpoint
from rlrobot.config import train_config
from rlrobot.policies.actor_critic import ActorCritic, ActorCriticConfig
from rlrobot.policies.registry import policy_metadata

TOKEN = "test-token"


def reach_expert_checkpoint(root, control_mode="ee_delta", nan=False):
    """An ActorCritic checkpoint whose weights are set by hand to so101-reach's scripted expert, a P-controller on
    target - tcp (the last 3 state entries): a = 40 (target - tcp), clipped. ELU is the identity on positives, so a
    +10 bias in the hidden layer (removed again after it) makes the 2-layer MLP exactly that linear map."""
    cfg = train_config("ppo", task="so101-reach", control_mode=control_mode, logger="none",
                       policy=ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,), normalize_obs=False))
    env = rlrobot.make("so101-reach", 1, control_mode=control_mode)
    meta = policy_metadata(cfg, env)
    env.close()
    policy = ActorCritic(meta["obs_dim"], meta["action_dim"], cfg.policy)
    first, last = policy.actor[0], policy.actor[2]
    with torch.no_grad():
        first.weight.zero_()
        first.bias.fill_(10.0)
        last.weight.zero_()
        last.bias.zero_()
        if control_mode == "ee_delta":
            for i in range(3):
                first.weight[i, meta["obs_dim"] - 3 + i] = 1.0
                last.weight[i, i] = 40.0
                last.bias[i] = -400.0
        if nan:
            last.bias.fill_(float("nan"))
    return save_checkpoint(root, "iter_000001", policy, {"train": cfg.to_dict(), **meta})


@pytest.fixture(scope="session")
def expert_checkpoint(tmp_path_factory):
    return reach_expert_checkpoint(tmp_path_factory.mktemp("expert") / "checkpoints")


class ServerProcess:
    """``rlrobot serve`` in a real subprocess on an OS-chosen loopback port."""

    def __init__(self, checkpoint, port=0, token=TOKEN, extra=()):
        args = [sys.executable, "-m", "rlrobot", "serve", "--checkpoint", str(checkpoint), "--port", str(port), *extra]
        args += ["--token", token] if token else ["--insecure"]
        env = {**os.environ, "MUJOCO_GL": "egl"}
        # stderr to a file, not a pipe: a chatty server must never block on a full pipe nobody reads
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        deadline = time.time() + 60
        line = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("{") and json.loads(line).get("event") == "listening":
                break
            if self.proc.poll() is not None:
                self.stderr.seek(0)
                raise RuntimeError(f"server exited: {self.stderr.read()}")
        self.info = json.loads(line)
        self.url = self.info["url"]
        self.port = int(self.url.rsplit(":", 1)[1])

    def kill(self):
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def server(expert_checkpoint):
    srv = ServerProcess(expert_checkpoint)
    yield srv
    srv.stop()


def self_signed_certificate(tmp_path):
    """(cert.pem, key.pem) of a self-signed certificate for 127.0.0.1 (cryptography or the openssl CLI; else skip)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        from cryptography import x509  # noqa: F401

        have_cryptography = True
    except ImportError:
        have_cryptography = False
    if have_cryptography:
        make_self_signed_with_cryptography(cert, key)
    elif subprocess.run(["which", "openssl"], capture_output=True).returncode == 0:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    else:
        pytest.skip("neither the cryptography package nor the openssl CLI is available to make a test certificate")
    return cert, key


def make_self_signed_with_cryptography(cert_path, key_path):
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
