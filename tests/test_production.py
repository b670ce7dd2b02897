"""The production settings (``DJANGO_DEBUG=0``) as a hosted deployment runs them, in real
processes: the health check a load balancer makes on plain HTTP, the SSL redirect of
everything else, ``check --deploy`` with the README's documented settings, and the example
systemd units."""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def production_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The environment of a production process: no DEBUG, a real secret, its own database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_", "SECURE_"))}
    env.update(
        DJANGO_DEBUG="0",
        SECRET_KEY="a-production-secret-for-the-tests-" + "x" * 40,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        BACKUP_DIR=str(tmp_path / "backups"),
        PYTHONUNBUFFERED="1",
    )
    env.pop("REDIS_URL", None)
    env.update(overrides)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def web_process(env: dict[str, str]) -> Iterator[str]:
    """``manage.py serve --no-scheduler`` (uvicorn) with ``env``; yields its base URL once it
    accepts connections, stops it after."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--no-scheduler", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"server did not start:\n{proc.communicate()[0]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=15)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str, **headers: str):
    """(status, headers, body) of a GET that follows no redirect."""
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        response = opener.open(urllib.request.Request(url, headers=headers), timeout=10)
    except urllib.error.HTTPError as exc:
        response = exc
    with response:
        return response.status, response.headers, response.read()


def test_the_health_check_answers_plain_http_and_everything_else_redirects_to_https(tmp_path):
    with web_process(production_env(tmp_path)) as base:
        status, headers, body = get(f"{base}/api/v1/health")
        assert status == 200, body
        assert json.loads(body) == {"status": "ok", "database": "ok"}
        for path in ("/api/v1/entries", "/console/", "/api/v1/health/"):
            status, headers, _ = get(base + path)
            assert status == 301, path
            assert headers["Location"] == f"https://{base.removeprefix('http://')}{path}"
        # Behind the load balancer's TLS (the header the settings trust), nothing redirects.
        status, _, body = get(f"{base}/api/v1/entries", **{"X-Forwarded-Proto": "https"})
        assert status == 401 and "detail" in json.loads(body)


def test_the_health_check_fails_when_the_database_is_unreachable(tmp_path):
    # Nothing listens on port 9 of the loopback: every connection is refused at once.
    env = production_env(tmp_path, DATABASE_URL="postgres://postgres@127.0.0.1:9/nothing", DB_POOL="0")
    with web_process(env) as base:
        status, headers, body = get(f"{base}/api/v1/health")
        assert status == 503, body
        assert json.loads(body) == {"status": "unavailable", "detail": "database unreachable"}
        assert int(headers["Retry-After"]) > 0


def documented_production_env() -> dict[str, str]:
    """The environment file of the README's hosted section, as written there."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- production-env -->", 1)[1].split("<!-- /production-env -->", 1)[0]
    lines = [line for line in block.splitlines() if line and not line.startswith("```")]
    return dict(line.split("=", 1) for line in lines)


def test_check_deploy_is_clean_with_the_documented_production_settings(tmp_path):
    documented = documented_production_env()
    assert documented["DJANGO_DEBUG"] == "0" and documented["DATABASE_URL"].startswith("postgres://")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_", "SECURE_", "DB_"))}
    env.update(documented)
    env["SECRET_KEY"] = secrets.token_urlsafe(50)  # the README says: generate one
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout, done.stdout


UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_the_example_systemd_units_verify_cleanly(unit, tmp_path):
    # The units name /srv/memory-steward and /etc/memory-steward/env; here they point at this
    # checkout, the virtualenv running the tests (it has the programs they start) and an
    # environment file of the test.
    env_file = tmp_path / "env"
    env_file.write_text("DJANGO_DEBUG=0\n")
    text = unit.read_text().replace("/etc/memory-steward/env", str(env_file))
    text = text.replace("/srv/memory-steward/.venv/bin", str(Path(sys.executable).parent))
    text = text.replace("/srv/memory-steward", str(ROOT))
    (tmp_path / unit.name).write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / unit.name)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout + done.stderr == ""  # not even a warning (an unknown key is one)
    assert "ExecStart=" in text and "KillMode=mixed" in text
