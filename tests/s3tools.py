"""A real S3 endpoint on 127.0.0.1 for tests: moto's standalone server (PyPI `moto[server]`) as a subprocess.

    server = start_moto(log_dir)                 # a free port, waits until it answers, creates the bucket
    with server.environ():                       # AWS_* of this endpoint in os.environ (restored after)
        ...                                      # code that reads s3:// the standard way
    uri = server.upload(local_run, "prefix")     # s3://<bucket>/prefix/<run id>/... (a copy of the folder)
    server.listing("prefix/")                    # key -> ETag of every object under a prefix
    with server.auth_enforced() as (key, secret):  # moto checks signatures: only this key is let in
        ...
    server.stop()

conftest.py's session fixture `s3` is one such server. Nothing leaves 127.0.0.1; the keys are dummies.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from endpoints import EnvEndpoint, free_port  # noqa: F401 - free_port: for the tests that import it from here

REGION = "us-east-1"
DUMMY_KEY, DUMMY_SECRET = "testing-key-id", "testing-secret"
MOTO_SERVER = Path(sys.executable).parent / "moto_server"
# Every AWS_* variable that would change where or as whom a client talks: unset by environ() unless given.
AWS_SETTINGS: tuple[str, ...] = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION",
                "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CA_BUNDLE")  # fmt: skip


def _post(url: str, body: bytes) -> dict:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read().decode())


@dataclass
class S3Server(EnvEndpoint):
    """One moto server: its endpoint, a bucket in it, and the environment that points a client at it."""

    SETTINGS = AWS_SETTINGS
    family = "s3"  # the store's backend (jobs.store.REMOTE_SCHEMES)
    endpoint_url: str
    bucket: str
    process: subprocess.Popen
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    _iam_key: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        self.env = {
            "AWS_ACCESS_KEY_ID": DUMMY_KEY,
            "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint_url,
        }

    def uri(self, *parts: str) -> str:
        """s3://<bucket>/<parts...>"""
        return "/".join([f"s3://{self.bucket}", *(p.strip("/") for p in parts)])

    def client(self, service: str = "s3", key: tuple[str, str] | None = None):
        """A boto3 client of this endpoint (the dummy keys, or `key`)."""
        import boto3

        key_id, secret = key or (DUMMY_KEY, DUMMY_SECRET)
        return boto3.client(service, endpoint_url=self.endpoint_url, region_name=REGION, aws_access_key_id=key_id,
                            aws_secret_access_key=secret)  # fmt: skip

    def listing(self, prefix: str = "") -> dict[str, str]:
        """key -> ETag of every object under `prefix` (what a rerun must leave unchanged)."""
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        return out

    def upload(self, local: Path, prefix: str = "", bucket: str | None = None) -> str:
        """Copy a local folder (a run directory) to s3://<bucket>/<prefix>/<folder name>/; returns that URI."""
        local = Path(local)
        bucket = bucket or self.bucket
        base = "/".join(p for p in (prefix.strip("/"), local.name) if p)
        client = self.client()
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"{base}/{path.relative_to(local).as_posix()}")
        return f"s3://{bucket}/{base}"

    def iam_key(self) -> tuple[str, str]:
        """An access key of an IAM user allowed s3:* (made once, while moto still lets everyone in)."""
        if self._iam_key is None:
            iam = self.client("iam")
            iam.create_user(UserName="xsbert-reader")
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
            iam.put_user_policy(UserName="xsbert-reader", PolicyName="s3", PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName="xsbert-reader")["AccessKey"]
            self._iam_key = (key["AccessKeyId"], key["SecretAccessKey"])
        return self._iam_key

    @contextlib.contextmanager
    def auth_enforced(self) -> Iterator[tuple[str, str]]:
        """moto checks every request's signature and IAM policy (its INITIAL_NO_AUTH_ACTION_COUNT set to 0 through
        /moto-api/reset-auth): unknown keys get 403 InvalidAccessKeyId, a wrong secret 403 SignatureDoesNotMatch.
        Yields the one key that is let in; lets everyone in again after."""
        key = self.iam_key()
        _post(f"{self.endpoint_url}/moto-api/reset-auth", b"0")
        try:
            yield key
        finally:
            _post(f"{self.endpoint_url}/moto-api/reset-auth", b"inf")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _wait_until_up(url: str, process: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    return False


def start_moto(log_dir: Path, bucket: str = "xsbert-test", timeout: float = 60.0, tries: int = 3) -> S3Server:
    """moto_server on a free port of 127.0.0.1 (a few tries: the port may be taken in between), up and answering,
    with `bucket` created. The caller stops it (S3Server.stop)."""
    if not MOTO_SERVER.is_file():
        raise RuntimeError(f"{MOTO_SERVER} is missing: pip install 'moto[server]' (pyproject.toml's test extras)")
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for attempt in range(tries):
        port = free_port()
        log = log_dir / f"moto-{port}.log"
        with open(log, "wb") as fh:
            process = subprocess.Popen([str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)], stdout=fh,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        server = S3Server(f"http://127.0.0.1:{port}", bucket, process, log)
        if _wait_until_up(server.endpoint_url, process, timeout):
            server.client().create_bucket(Bucket=bucket)
            return server
        server.stop()
        if attempt == tries - 1:
            raise RuntimeError(f"moto_server did not come up on port {port}: {log.read_text(errors='replace')[-2000:]}")
    raise AssertionError("unreachable")
