"""Signing throughput with a key on a PKCS#11 token beside a file key: requests/s through the proxy.

    .venv/bin/python bench/token_signing.py [--duration 10] [--conns 64] [--quick] [--json FILE]

Initialises a SoftHSM2 token in a temporary directory (Debian ``softhsm2``; ``pip install
'.[hsm]'``), makes an Ed25519 key pair on it with ``signing-proxy keys generate --pkcs11``, and starts
two proxies on core 1: one signing with a file key (in-line, the hot path), one with the token key
(``signing.key: pkcs11:...``, signed on the token's thread off the event loop). ``wrk`` (core 0)
sends GET at ``--conns`` connections through each to a loopback origin that verifies a sample of
the requests with the right public key; the run fails if any sample does not verify. Prints
requests/s, p50/p99 latency and proxy CPU per request for both rows, and their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from run import PY, ROOT, cpu_seconds, ensure_wrk, free_port, pin, process, run_wrk, wait_port

from signing_proxy.core.b64 import b64url_decode
from signing_proxy.core.jwk import PublicKey, SigningKey

SOFTHSM_MODULES = ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
PIN = "bench-pin-1234"


def token(tmp: Path) -> tuple[dict[str, str], str]:
    """A fresh SoftHSM2 token under ``tmp``: the environment that finds it, and the module path."""
    module = next((m for m in SOFTHSM_MODULES if Path(m).exists()), None)
    if module is None or shutil.which("softhsm2-util") is None:
        raise SystemExit("softhsm2 is required (apt-get install softhsm2)")
    (tmp / "tokens").mkdir()
    conf = tmp / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {tmp / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    env = {**os.environ, "SOFTHSM2_CONF": str(conf), "BENCH_TOKEN_PIN": PIN}
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", "bench", "--so-pin", "so-1234", "--pin", PIN],
        check=True,
        capture_output=True,
        env=env,
        timeout=30,
    )
    return env, module


def pem(public: PublicKey, path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(
        public.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return path


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run (default 10)")
    parser.add_argument("--conns", type=int, default=64, help="wrk connections (default 64)")
    parser.add_argument("--quick", action="store_true", help="2 s runs")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    duration = 2 if args.quick else args.duration
    wrk = ensure_wrk()
    with tempfile.TemporaryDirectory(prefix="bench-pkcs11-") as name:
        tmp = Path(name)
        env, module = token(tmp)
        uri = "pkcs11:token=bench;object=agent"
        settings = tmp / "token.yaml"
        settings.write_text(
            json.dumps(
                {
                    "data_dir": str(tmp / "data"),
                    "signing": {"key": uri, "pkcs11": {"module": module, "pin_env": "BENCH_TOKEN_PIN"}},
                    "log": {"access_log": False, "level": "warning"},
                }
            )
        )
        made = subprocess.run(
            [PY, "-m", "signing_proxy", "keys", "generate", "--config", str(settings), "--pkcs11", uri],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            timeout=60,
        )
        jwk = json.loads(made.stdout.split("public jwk:", 1)[1])
        token_public = PublicKey.from_raw(b64url_decode(jwk["x"]))
        file_key = SigningKey.generate()
        key_path = tmp / "file-key.pem"
        key_path.write_bytes(file_key.to_pem())
        key_path.chmod(0o600)
        file_settings = tmp / "file.yaml"
        file_settings.write_text(
            json.dumps(
                {
                    "data_dir": str(tmp / "data"),
                    "signing": {"key": str(key_path)},
                    "log": {"access_log": False, "level": "warning"},
                }
            )
        )
        rows = []
        stats = []
        with contextlib.ExitStack() as stack:
            for label, config, public in (
                ("file key", file_settings, file_key.public),
                ("token key", settings, token_public),
            ):
                origin_port, proxy_port = free_port(), free_port()
                origin = [*pin(0), PY, str(ROOT / "bench/origin.py"), "--port", str(origin_port)]
                origin += ["--public-key-pem", str(pem(public, tmp / f"{label[0]}.pub.pem"))]
                stack.enter_context(process(origin))
                command = [*pin(1), PY, "-m", "signing_proxy", "run", "--config", str(config)]
                command += ["--listen", f"127.0.0.1:{proxy_port}"]
                proxy = stack.enter_context(process_with_env(command, env))
                wait_port(origin_port)
                wait_port(proxy_port)
                url = f"http://127.0.0.1:{origin_port}/bench"
                cpu0 = cpu_seconds(proxy.pid)
                rps, p50, p99, total = run_wrk(wrk, proxy_port, url, "GET", args.conns, duration, tmp)
                cpu_us = (cpu_seconds(proxy.pid) - cpu0) / total * 1e6
                rows.append({"key": label, "conns": args.conns, "rps": rps, "p50_ms": p50, "p99_ms": p99})
                rows[-1]["proxy_cpu_us_per_request"] = cpu_us
                with urllib.request.urlopen(f"http://127.0.0.1:{origin_port}/stats", timeout=10) as resp:
                    stats.append(json.loads(resp.read()))
    print(f"\nsigning throughput, GET through the proxy, wrk -t1 -c{args.conns}, {duration} s per run")
    print(f"{'key':10} | {'rps':>8} {'p50 ms':>7} {'p99 ms':>7} {'cpu us/req':>10}")
    for row in rows:
        print(
            f"{row['key']:10} | {row['rps']:>8.0f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} "
            f"{row['proxy_cpu_us_per_request']:>10.1f}"
        )
    print(f"token/file rps ratio: {rows[1]['rps'] / rows[0]['rps']:.2f}")
    verified = sum(s["verified"] for s in stats)
    failed = sum(s["failed"] for s in stats)
    print(f"origins verified {verified} sampled requests, {failed} failed")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": rows, "verified": verified, "failed": failed}, indent=2)
        )
    return 1 if failed or not all(s["verified"] for s in stats) else 0


@contextlib.contextmanager
def process_with_env(args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``run.process`` with an environment (the token's SOFTHSM2_CONF and PIN variable)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
