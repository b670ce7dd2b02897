"""Processes: a forked process never shares a PostgreSQL connection or pool with its parent
(django-q2 forks its workers, monitor and pusher), with the pool and server-side prepared
statements of the hosted settings."""

import json

import pytest
from django.db import connection

from tests.helpers_subprocess import helper, subprocess_env

pytestmark = pytest.mark.django_db


def database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the pool is PostgreSQL's")
@pytest.mark.parametrize("close_first", [True, False], ids=["closed-before-fork", "open-at-fork"])
def test_forked_children_open_their_own_connections_and_the_parent_keeps_its_own(tmp_path, close_first):
    env = subprocess_env(database_url(), tmp_path)
    env.update(DB_POOL="1", DB_PREPARED="1")
    args = ["fork", "--children", "3", "--queries", "20"] + (["--close-first"] if close_first else [])
    result = json.loads(helper(args, env, timeout=60).splitlines()[-1])
    assert result["errors"] == []
    assert result["exit_codes"] == [0, 0, 0]
    every = [result["parent"], *result["children"]]
    assert all(every), every
    for i, pids in enumerate(every):  # no backend (PostgreSQL session) serves two processes
        for other in every[i + 1 :]:
            assert not set(pids) & set(other), every
