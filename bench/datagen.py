"""Fill one workspace with N realistic memories, fast (for benchmarks; PostgreSQL or SQLite).

    .venv/bin/python bench/datagen.py --database-url postgres://postgres@127.0.0.1:5432/bench_api \
        [--entries 1000000] [--workspace SLUG] [--seed 1] [--regenerate]

Text is built from a vocabulary of agent-memory sentences (decisions, fixes, observations,
rules, ...) with Zipf-like word frequencies, mixed with the commit messages of the bundled BSD
sample (``memory/sample_data/flask_journal_sample.jsonl``) wrapped in varied context, so
contents are varied and nearly all distinct. Every row is a realistic latest version
(lineage_id = id): entry types, tiers, sources, statuses (active, stale, archived, staged,
tombstoned with its Tombstone row), ``created_at`` spread over two years with more recent
growth, impact/trust/validation/significance/salience, access counts with per-actor access
rows, pins, TTLs, projects, sessions, tags, code anchors, links and lifecycle events.

PostgreSQL: one transaction; the secondary indexes of the loaded tables are dropped, the rows
written with COPY, the indexes rebuilt (those of memory_entry after scoring), stored scores
computed by the project's own SQL (``memory.scoring_db.refresh_scores``), then
VACUUM FULL + ANALYZE of memory_entry (the score UPDATE leaves one dead version per row). The
generated ``search_vector`` column is computed by PostgreSQL on insert. SQLite: batched
``executemany`` (the FTS5 triggers index every row), then the same score refresh.

A generated workspace is marked in its ``name`` (``datagen n=… seed=… max_id=…``); the same
N and seed again reuses it (``--regenerate`` rebuilds it). ``cleanup_extra`` removes entries
added after generation (e.g. by the API benchmark's POSTs) so reruns start from the same data.

The vocabulary part (``TextGen``) does not import Django, so load generators can use it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The project first (bench/maintenance.py would shadow its ``maintenance`` package), bench/ last.
sys.path[:] = [
    str(ROOT),
    *(p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"),
    str(ROOT / "bench"),
]
SAMPLE_FILE = ROOT / "memory" / "sample_data" / "flask_journal_sample.jsonl"
DEFAULT_SLUG = "bench"
SPAN_DAYS = 730  # created_at over about two years before "now"
MARK = re.compile(r"^datagen n=(\d+) seed=(\d+) max_id=(\d+)(?: secs=(\d+))?$")

# --- vocabulary ----------------------------------------------------------------------------------
# Ordered roughly by how often an agent would write about them: earlier words are drawn more
# often (Zipf-like weights), so search queries see both very common and rare words.

COMPONENTS = """
api cache database migration scheduler worker queue auth login session config deploy pipeline
index search importer exporter parser serializer router middleware template webhook billing
invoice payment checkout cart notification email logger metrics dashboard frontend backend
gateway proxy loadbalancer storage bucket upload download thumbnail report export csv pdf
permission role tenant workspace token password signup onboarding settings profile admin
console cli sdk client server socket stream batch cron retry timeout healthcheck feature flag
rollout canary backup restore snapshot replica shard partition lock transaction connection pool
coupon discount refund subscription plan trial quota usage meter ledger payout tax currency
shipment inventory warehouse catalog product variant price order fulfillment tracking carrier
address geocoder map locale translation timezone calendar reminder digest newsletter inbox
attachment preview avatar comment thread mention reaction feed timeline activity audit consent
gdpr retention archive purge tombstone sitemap crawler scraper embedding ranking recommendation
classifier tokenizer prompt transcript summary evaluation fixture factory seed sandbox staging
preview-env secret vault certificate dns cdn firewall ratelimiter
""".split()  # noqa: SIM905 - a word list reads best as text

TECHS = """
postgres redis django celery nginx docker kubernetes terraform python typescript react sqlite
rabbitmq kafka elasticsearch s3 gunicorn uvicorn pydantic pytest github-actions sentry
prometheus grafana openapi graphql websocket oauth jwt cloudflare stripe twilio sendgrid mypy
ruff black poetry uv htmx tailwind vite webpack jest playwright selenium pgbouncer clickhouse
duckdb bigquery snowflake airflow dbt spark pandas numpy fastapi flask
""".split()  # noqa: SIM905 - a word list reads best as text

ERROR_KINDS = """
Timeout Validation Conflict Sync Parse Permission Quota Lock Integrity Decode
""".split()  # noqa: SIM905 - a word list reads best as text

VERBS = """
memoize validate paginate prefetch dedupe migrate rename split merge refactor deprecate pin
upgrade downgrade throttle debounce sanitize compress encrypt hash sign verify redact trace
instrument benchmark bisect stub denormalize normalize vacuum reindex backfill rollback
""".split()  # noqa: SIM905 - a word list reads best as text

SYMPTOMS = """
timeouts|deadlocks|duplicate rows|stale reads|memory leak|slow queries|500 errors on save|
flaky tests|race condition|missing translations|broken pagination|wrong totals|off-by-one dates|
timezone drift|lost updates|double charges|empty responses|n+1 queries|connection exhaustion|
cache stampede|unbounded retries|oversized payloads|encoding errors|silent data loss|
high p99 latency|cpu spikes|disk full|expired certificates|rate limit hits|infinite redirects
""".replace("\n", "").split("|")

CAUSES = """
a missing index on the foreign key|an unbounded loop over all rows|a naive datetime compared with
an aware one|the ORM loading every column|a shared mutable default argument|a retry without
backoff|the cache key ignoring the tenant|a transaction held open during an HTTP call|
a float used for money|the serializer re-querying each relation|a lock taken in the wrong order|
an environment variable read at import time|a race between two workers|a stale connection in
the pool|the default page size of 10000|a regex with catastrophic backtracking|
an unescaped user string in the query|clock skew between hosts|a missing unique constraint|
the migration running outside a transaction
""".replace("\n", " ").split("|")

REASONS = """
it keeps the write path simple|it halves the p95 latency|the team already runs it in production|
it removes a whole class of bugs|it is what the upstream docs recommend|it avoids a second
network round trip|the old approach did not survive a restart|it makes the behaviour testable|
it keeps tenants isolated|it is cheaper to operate|rollback stays a one-line change|
the vendor SDK is no longer maintained|it works the same on SQLite and PostgreSQL|
it keeps the API backwards compatible
""".replace("\n", " ").split("|")

CONDITIONS = """
the queue backs up|a tenant has more than 10k rows|two requests race|the worker restarts|
the cache is cold|the token expires mid-request|the upload is over 50 MB|the user switches
timezone|the replica lags|a deploy happens during a migration|the job is retried|the feature flag
is off|the locale is not English|the network drops|the batch is empty
""".replace("\n", " ").split("|")

RULES = """
Always run migrations in a transaction.|Never log raw tokens or passwords.|Always scope queries by
workspace.|Prefer set-based updates over per-row loops.|Never call external services inside a
database transaction.|Pin dependency versions in the lock file.|Add a regression test with
every bug fix.|Keep API errors as JSON with a detail field.|Use UTC everywhere and convert at the
edge.|Back up before any destructive maintenance.|Review every schema change for lock time.|
Do not retry non-idempotent requests automatically.|Feature flags must have an owner and an
expiry date.|Read configuration from the environment only.
""".replace("\n", " ").split("|")

PROJECTS = """
checkout-service billing-api mobile-app data-pipeline search-platform auth-service web-frontend
infra ml-ranking support-bot docs-site analytics
""".split()  # noqa: SIM905 - a word list reads best as text

AGENTS = ["agent:claude-code", "agent:support-bot", "agent:ci-reviewer", "agent:planner", "user:alice"]
AUTHORS = ["agent:claude-code", "agent:support-bot", "agent:ci-reviewer", "import:journal", "agent:planner"]

ENTRY_TYPES = {
    "development_note": 20,
    "bug_fix": 15,
    "observation": 15,
    "technical_note": 12,
    "decision": 10,
    "lesson": 6,
    "rule": 4,
    "research": 4,
    "planning": 4,
    "test_entry": 3,
    "maintenance": 3,
    "retrospective": 2,
    "release": 2,
    "other": 1,
}
TIERS = {"episodic": 800, "semantic": 120, "procedural": 77, "constitutional": 3}
SOURCES = {"agent": 750, "import": 200, "platform": 30, "operator": 18, "system": 2}
STATUSES = {"active": 850, "stale": 70, "archived": 50, "staged": 20, "tombstoned": 10}
SIGNIFICANCE = [
    "milestone",
    "breakthrough",
    "decision",
    "architecture",
    "lesson_learned",
    "blocker_resolved",
    "release",
    "security",
]
LINK_TYPES = {
    "references": 60,
    "implements": 8,
    "clarifies": 8,
    "response_to": 6,
    "evolves_from": 6,
    "resolved": 4,
    "blocked_by": 3,
    "caused": 3,
    "supersedes": 1,
    "duplicates": 1,
}
STAGED_TTL_DAYS = {"procedural": 60, "conceptual": 60, "reference": 45, "analogical": 30, "evidence": 14}


def _zipf_pool(words: Sequence[str], size: int = 4000, s: float = 0.9) -> list[str]:
    """A list in which ``words[k]`` appears about in proportion to 1/(k+1)^s: uniform draws
    from it follow a Zipf-like law (one ``choice`` call per word, fast)."""
    words = [" ".join(w.split()) for w in words]
    weights = [1.0 / (k + 1) ** s for k in range(len(words))]
    total = sum(weights)
    pool: list[str] = []
    for word, w in zip(words, weights, strict=True):
        pool.extend([word] * max(1, round(size * w / total)))
    return pool


def _weighted_pool(weights: dict[str, int]) -> list[str]:
    return [k for k, w in weights.items() for _ in range(w)]


@dataclass
class GeneratedText:
    title: str
    content: str
    entry_type: str
    tags: list[str]
    project: str


@dataclass
class TextGen:
    """Deterministic (per seed) generator of memory texts and search queries."""

    seed: int = 1
    journal: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        if not self.journal and SAMPLE_FILE.is_file():
            with SAMPLE_FILE.open(encoding="utf-8") as fh:
                self.journal = [json.loads(line) for line in fh if line.strip()]
        self.components = _zipf_pool(COMPONENTS, size=6000, s=0.75)
        self.techs = _zipf_pool(TECHS, s=0.75)
        self.verbs = _zipf_pool(VERBS, s=0.6)
        self.symptoms = _zipf_pool(SYMPTOMS)
        self.causes = _zipf_pool(CAUSES)
        self.reasons = _zipf_pool(REASONS)
        self.conditions = _zipf_pool(CONDITIONS)
        self.projects = _zipf_pool(PROJECTS, size=400)
        self.types = _weighted_pool(ENTRY_TYPES)
        self.paths = sorted({a["path"] for r in self.journal for a in r.get("anchors", [])}) or ["app.py"]
        names = [f"{c.title().replace('-', '')}{k}Error" for c in COMPONENTS for k in ERROR_KINDS]
        random.Random(5).shuffle(names)
        self.errors = _zipf_pool(names, size=8000, s=0.7)
        # Agents search for what they need, not for the most frequent words: query words are
        # drawn uniformly from the vocabulary (so common and rare words alike).
        self.query_words = sorted(set(COMPONENTS + TECHS + VERBS))
        self.error_names = sorted(names)

    # sentences -------------------------------------------------------------------------------
    def _sentence(self, kind: str) -> str:
        r = self.rng
        c, t = r.choice(self.components), r.choice(self.techs)
        if kind == "decision":
            return (
                f"Decided to {r.choice(self.verbs)} the {c} {r.choice(('with', 'in', 'through', 'behind'))} "
                f"{t} because {r.choice(self.reasons)}."
            )
        if kind == "bug_fix":
            return (
                f"Fixed {r.choice(self.symptoms)} in the {c} ({r.choice(self.errors)}) when "
                f"{r.choice(self.conditions)}; the root cause was {r.choice(self.causes)}."
            )
        if kind == "observation":
            return (
                f"The {c} p95 latency goes from {r.randint(5, 80)} ms to {r.randint(100, 2500)} ms "
                f"when {r.choice(self.conditions)}."
            )
        if kind == "rule":
            return f"{' '.join(r.choice(RULES).split())} This applies to the {c} and every {t} job."
        if kind == "lesson":
            return (
                f"Lesson: {r.choice(self.errors)} in the {c} came from {r.choice(self.causes)}; "
                f"next time {r.choice(self.verbs)} it first."
            )
        if kind == "technical_note":
            return (
                f"The {c} uses {t} for {r.choice(self.components)}; "
                f"{r.choice(self.verbs)} runs every {r.choice((1, 5, 10, 15, 30, 60))} minutes."
            )
        if kind == "planning":
            return (
                f"Next sprint: {r.choice(self.verbs)} the {c} and move the "
                f"{r.choice(self.components)} to {t}."
            )
        if kind == "research":
            return (
                f"Compared {t} and {r.choice([x for x in TECHS if x != t])} for the {c}: "
                f"the first is {r.randint(2, 9)}x faster at {r.choice(self.verbs)}."
            )
        if kind == "release":
            return f"Released {c} v{r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 9)} with {t} support."
        if kind == "maintenance":
            return f"Ran {r.choice(self.verbs)} on the {c} {t} tables; {r.randint(1, 900)}k rows touched."
        if kind == "test_entry":
            return (
                f"Added tests for the {c} covering {r.choice(self.symptoms)} "
                f"when {r.choice(self.conditions)}."
            )
        if kind == "retrospective":
            return (
                f"Retro: the {c} incident lasted {r.randint(5, 240)} minutes; {r.choice(self.causes)} "
                f"was missed in review."
            )
        if r.random() < 0.3:
            return (
                f"Saw {r.choice(self.errors)} from the {c} after the {t} upgrade; "
                f"{r.choice(self.verbs)} helped."
            )
        return f"Working on the {c} with {t}: {r.choice(self.verbs)} after {r.choice(self.symptoms)}."

    def entry(self) -> GeneratedText:
        r = self.rng
        kind = r.choice(self.types)
        project = r.choice(self.projects)
        if self.journal and r.random() < 0.25:
            rec = r.choice(self.journal)
            body = rec["content"]
            wrap = r.random()
            if wrap < 0.3:
                body = f"Upstream Flask change worth knowing for {project}: {body}"
            elif wrap < 0.6:
                body = f"{body}\n\n{self._sentence(kind)}"
            elif wrap < 0.8:
                body = f"While upgrading {r.choice(self.techs)} in {project}: {body}"
            else:
                body = f"{body}\n\n(Seen again in {project} on {r.randint(1, 28)}/{r.randint(1, 12)}.)"
            content = body
            title = rec["content"].split("\n", 1)[0][:120] if r.random() < 0.5 else ""
            tags = list(rec.get("tags", []))[:3]
        else:
            n = 1 + min(int(r.expovariate(0.6)), 8)  # 1..9 sentences, mostly 1-3
            sentences = [self._sentence(kind)]
            sentences += [self._sentence(r.choice(self.types)) for _ in range(n - 1)]
            if r.random() < 0.2:
                sentences.append(f"See #{r.randint(100, 9999)} and {r.choice(self.paths)}.")
            content = " ".join(sentences)
            if r.random() < 0.15:  # a paragraph break now and then
                cut = max(1, len(sentences) // 2)
                content = " ".join(sentences[:cut]) + "\n\n" + " ".join(sentences[cut:])
            title = ""
            if r.random() < 0.6:
                label = kind.replace("_", " ").capitalize()
                title = f"{label}: {r.choice(self.components)} {r.choice(self.verbs)}"
            tags = [r.choice(self.components) for _ in range(min(int(r.expovariate(0.8)), 4))]
        if r.random() < 0.5:
            tags.append(project)
        return GeneratedText(
            title=title[:200],
            content=content,
            entry_type=kind,
            tags=sorted(set(tags)),
            project=project,
        )

    def query(self) -> str:
        """A 1-3 word search query as an agent would type it."""
        r = self.rng
        if r.random() < 0.15:  # an error name, alone or with a component
            err = r.choice(self.error_names)
            return err if r.random() < 0.6 else f"{err} {r.choice(self.components)}"
        n = r.choices((1, 2, 3), weights=(30, 45, 25))[0]
        words: list[str] = []
        while len(words) < n:
            w = r.choice(self.query_words)
            if w not in words:
                words.append(w)
        return " ".join(words)

    def api_body(self, link_ids: Sequence[int] = ()) -> dict[str, Any]:
        """A realistic ``POST /entries`` body (an agent's write)."""
        r = self.rng
        g = self.entry()
        body: dict[str, Any] = {"content": g.content, "entry_type": g.entry_type, "project": g.project}
        if g.title:
            body["title"] = g.title
        if g.tags:
            body["tags"] = g.tags
        if r.random() < 0.6:
            body["impact_score"] = round(r.random() ** 2, 2)
        if r.random() < 0.6:
            body["trust_score"] = round(0.3 + 0.7 * r.random(), 2)
        if r.random() < 0.1:
            body["significance_type"] = r.choice(SIGNIFICANCE)
        if r.random() < 0.5:
            body["session_key"] = f"{g.project}-s{r.randint(1, 500)}"
        if r.random() < 0.25:
            body["anchors"] = [
                {"repo": f"acme/{g.project}", "path": r.choice(self.paths), "commit": _hex(r, 40)}
            ]
        if link_ids and r.random() < 0.2:
            body["links"] = [{"to_id": r.choice(link_ids), "type": r.choice(_weighted_pool(LINK_TYPES))}]
        return body


def _hex(r: random.Random, n: int) -> str:
    return f"{r.getrandbits(4 * n):0{n}x}"


# --- rows ----------------------------------------------------------------------------------------


ENTRY_COLUMNS = (
    "id",
    "workspace_id",
    "title",
    "content",
    "content_hash",
    "external_id",
    "project",
    "session_key",
    "entry_type",
    "tier",
    "source",
    "metadata",
    "impact_score",
    "trust_score",
    "validation_status",
    "significance_type",
    "salience",
    "access_count",
    "last_accessed_at",
    "retrieval_count",
    "reinforced_at",
    "last_feedback",
    "feedback_at",
    "pinned",
    "expires_at",
    "status",
    "status_changed_at",
    "archived_at",
    "staged_class",
    "ttl_expires_at",
    "review_kept_hash",
    "lineage_id",
    "supersedes_id",
    "is_latest",
    "importance",
    "created_at",
    "updated_at",
)


@dataclass
class Batch:
    entries: list[tuple[Any, ...]] = field(default_factory=list)
    tags: list[tuple[int, str]] = field(default_factory=list)  # (entry_id, tag name)
    links: list[tuple[Any, ...]] = field(default_factory=list)
    anchors: list[tuple[Any, ...]] = field(default_factory=list)
    accesses: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    tombstones: list[tuple[Any, ...]] = field(default_factory=list)


class RowGen:
    """Rows for ids first_id .. first_id+n-1, created_at ascending with the id."""

    def __init__(self, *, workspace_id: int, first_id: int, n: int, now: datetime, seed: int):
        self.ws = workspace_id
        self.first_id = first_id
        self.n = n
        self.now = now
        self.text = TextGen(seed=seed)
        self.rng = random.Random(seed * 7919 + 17)
        # Ages skewed towards the present (a workspace that grows): age = span * u^1.6.
        ages = sorted((SPAN_DAYS * self.rng.random() ** 1.6 for _ in range(n)), reverse=True)
        self.created = [now - timedelta(days=a) for a in ages]
        self.status: dict[int, str] = {}  # only non-active statuses, to judge link ends
        self.types_pool = _weighted_pool(LINK_TYPES)
        self.tiers = _weighted_pool(TIERS)
        self.sources = _weighted_pool(SOURCES)
        self.statuses = _weighted_pool(STATUSES)

    def batches(self, size: int) -> Iterator[Batch]:
        for start in range(0, self.n, size):
            yield self._batch(start, min(start + size, self.n))

    def _batch(self, lo: int, hi: int) -> Batch:
        from memory.write_input import content_hash  # Django is set up by now

        r, now, ws = self.rng, self.now, self.ws
        b = Batch()
        for k in range(lo, hi):
            eid = self.first_id + k
            created = self.created[k]
            g = self.text.entry()
            tier = r.choice(self.tiers)
            source = r.choice(self.sources)
            status = r.choice(self.statuses)
            if tier == "constitutional" and status not in ("active", "stale"):
                status = "active"
            if status != "active":
                self.status[eid] = status
            age = (now - created).total_seconds()
            changed = (
                created
                if status in ("active", "staged")
                else created + timedelta(seconds=age * (0.3 + 0.7 * r.random()))
            )
            staged_class = ttl = None
            if status == "staged":
                staged_class = r.choice(tuple(STAGED_TTL_DAYS))
                ttl = created + timedelta(days=STAGED_TTL_DAYS[staged_class])
            accessed = r.random() < 0.4
            access_count = 1 + min(int(r.expovariate(0.15)), 500) if accessed else 0
            last_access = created + timedelta(seconds=age * r.random()) if accessed else None
            reinforced = last_access if accessed and r.random() < 0.2 else None
            feedback = r.choice(("helpful", "helpful", "not_helpful", "stale")) if r.random() < 0.03 else ""
            metadata = (
                json.dumps({"agent": r.choice(AGENTS), "model": r.choice(("opus", "sonnet", "haiku"))})
                if r.random() < 0.1
                else "{}"
            )
            session = f"{g.project}-s{r.randint(1, 5000)}" if r.random() < 0.5 else ""
            expires = None
            if r.random() < 0.005:
                expires = created + timedelta(days=r.choice((7, 30, 90, 365)))
            b.entries.append(
                (
                    eid,
                    ws,
                    g.title,
                    g.content,
                    content_hash(g.content),
                    None,
                    g.project,
                    session,
                    g.entry_type,
                    tier,
                    source,
                    metadata,
                    round(r.random() ** 2, 3) if r.random() < 0.7 else None,
                    round(0.3 + 0.7 * r.random(), 3) if r.random() < 0.7 else None,
                    r.choices(("none", "passed", "failed"), weights=(80, 15, 5))[0],
                    r.choice(SIGNIFICANCE) if r.random() < 0.1 else None,
                    r.choice((0.25, 0.5, 0.75, 1.25, 1.5, 2.0)) if r.random() < 0.15 else None,
                    access_count,
                    last_access,
                    r.randint(0, access_count) if accessed else 0,
                    reinforced,
                    feedback,
                    last_access if feedback else None,
                    r.random() < 0.01,
                    expires,
                    status,
                    changed,
                    changed if status == "archived" else None,
                    staged_class,
                    ttl,
                    "",
                    eid,
                    None,
                    True,
                    0.0,
                    created,
                    changed if status != "active" else (last_access or created),
                )
            )
            for name in g.tags:
                b.tags.append((eid, name))
            author = r.choice(AUTHORS)
            first_status = "staged" if status == "staged" else "active"
            b.events.append((ws, eid, eid, "", first_status, "create", author, False, created, "{}"))
            if status in ("stale", "archived", "tombstoned"):
                reason = {"stale": "stale", "archived": "archive", "tombstoned": "decay"}[status]
                b.events.append((ws, eid, eid, "active", status, reason, "system", True, changed, "{}"))
            if status == "tombstoned":
                b.tombstones.append(
                    (
                        ws,
                        eid,
                        eid,
                        eid,
                        b.entries[-1][4],
                        "decay",
                        "active",
                        "system",
                        changed,
                        changed + timedelta(days=180),
                    )
                )
            if accessed:
                readers = r.sample(AGENTS, 1 + min(int(r.expovariate(1.2)), len(AGENTS) - 1))
                share = max(1, access_count // len(readers))
                for actor in readers:
                    b.accesses.append((ws, eid, actor, share, created, last_access))
            if k > 20 and r.random() < 0.12:  # links to earlier entries, mostly recent ones
                targets = set()
                for _ in range(1 + min(int(r.expovariate(1.0)), 4)):
                    back = 1 + min(int(r.expovariate(1 / 300)), k - 1)
                    targets.add(eid - back)
                for to in targets:
                    b.links.append((ws, eid, to, r.choice(self.types_pool), created, author))
            if r.random() < 0.2:
                for path in {r.choice(self.text.paths) for _ in range(1 + min(int(r.expovariate(1.5)), 3))}:
                    a_status = r.choices(("valid", "stale", "invalidated"), weights=(90, 8, 2))[0]
                    line = r.randint(1, 400)
                    b.anchors.append(
                        (
                            ws,
                            eid,
                            f"acme/{g.project}",
                            path,
                            _hex(r, 40),
                            line,
                            line + r.randint(0, 40),
                            _hex(r, 64),
                            a_status,
                            changed if a_status != "valid" else None,
                            created,
                        )
                    )
        return b


# --- writing -------------------------------------------------------------------------------------

LINK_COLS = ("workspace_id", "from_entry_id", "to_entry_id", "type", "created_at", "created_by")
ANCHOR_COLS = (
    "workspace_id",
    "entry_id",
    "repo",
    "path",
    "commit",
    "line_start",
    "line_end",
    "content_hash",
    "status",
    "checked_at",
    "created_at",
)
ACCESS_COLS = ("workspace_id", "lineage_id", "actor", "count", "first_at", "last_at")
EVENT_COLS = (
    "workspace_id",
    "entry_id",
    "entry_ref",
    "from_status",
    "to_status",
    "reason",
    "actor",
    "automatic",
    "created_at",
    "details",
)
TOMBSTONE_COLS = (
    "workspace_id",
    "entry_id",
    "entry_ref",
    "lineage_ref",
    "content_hash",
    "reason",
    "previous_status",
    "actor",
    "created_at",
    "purge_after",
)
LOADED_TABLES = (
    "memory_entry",
    "memory_entry_tags",
    "memory_relationship",
    "memory_codeanchor",
    "memory_entryaccess",
    "memory_lifecycleevent",
    "memory_tombstone",
)


@dataclass
class Result:
    workspace_id: int
    slug: str
    entries: int
    reused: bool
    seconds: float
    phases: dict[str, float]
    counts: dict[str, int]


def log(msg: str) -> None:
    print(f"[datagen {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure(
    n: int,
    *,
    slug: str | None = None,
    seed: int = 1,
    regenerate: bool = False,
    batch_size: int = 20_000,
    progress: Callable[[str], None] = log,
) -> Result:
    """The workspace ``slug`` (default ``bench-<N>``) holding exactly the N generated entries
    (Django must be set up)."""
    from django.db import connection

    from memory import accounts
    from memory.models import Workspace

    slug = slug or f"{DEFAULT_SLUG}-{n}"
    ws = Workspace.objects.filter(slug=slug).first()
    if ws is not None and not regenerate:
        m = MARK.match(ws.name or "")
        if m and int(m.group(1)) == n and int(m.group(2)) == seed:
            removed = cleanup_extra(ws)
            if removed:
                progress(f"removed {removed} entries added after generation")
            if connection.vendor == "postgresql":
                # An earlier run's writes and their removal leave dead rows that every index
                # scan steps over until autovacuum (at 20% of a table) would come: each run
                # starts from the same vacuumed state instead.
                t = time.perf_counter()
                with connection.cursor() as c:
                    for table in CLEANED_TABLES:
                        c.execute(f"VACUUM ANALYZE {table}")
                progress(f"vacuumed in {time.perf_counter() - t:.1f} s")
            return Result(ws.pk, slug, n, True, float(m.group(4) or 0), {}, {})
    if ws is not None:
        progress(f"dropping workspace {slug!r} and its rows")
        t = time.perf_counter()
        _drop_workspace(ws)
        progress(f"dropped in {time.perf_counter() - t:.1f} s")
    ws = accounts.workspace_create(slug=slug, name=f"datagen n={n} seed={seed} (incomplete)")
    t0 = time.perf_counter()
    if connection.vendor == "postgresql":
        phases, counts = _generate_postgresql(ws, n, seed, batch_size, progress)
    else:
        phases, counts = _generate_sqlite(ws, n, seed, batch_size, progress)
    total = time.perf_counter() - t0
    ws.refresh_from_db()
    ws.name = f"{ws.name} secs={total:.0f}"  # so that a reuse can still say how long it took
    ws.save(update_fields=["name"])
    progress(
        f"generated {n} entries in {total:.1f} s: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
    )
    return Result(ws.pk, slug, n, False, total, phases, counts)


def generated_max_id(ws: Any) -> int | None:
    m = MARK.match(ws.name or "")
    return int(m.group(3)) if m else None


CLEANED_TABLES = (
    "memory_entry",
    "memory_entry_tags",
    "memory_lifecycleevent",
    "memory_codeanchor",
    "memory_relationship",
    "memory_entryaccess",
)


def cleanup_extra(ws: Any) -> int:
    """Delete entries created after generation (ids above the generated ones), with their rows."""
    from django.db import transaction

    from memory.models import Entry, EntryAccess, LifecycleEvent, Tombstone

    max_id = generated_max_id(ws)
    if max_id is None:
        return 0
    with transaction.atomic():
        extra = Entry.objects.filter(workspace=ws, pk__gt=max_id)
        n = extra.count()
        if n:
            from maintenance.models import Dispute

            Dispute.objects.filter(workspace=ws, entry_a_id__gt=max_id).delete()
            Dispute.objects.filter(workspace=ws, entry_b_id__gt=max_id).delete()
            Tombstone.objects.filter(workspace=ws, entry_ref__gt=max_id).delete()
            EntryAccess.objects.filter(workspace=ws, lineage_id__gt=max_id).delete()
            LifecycleEvent.objects.filter(workspace=ws, entry_ref__gt=max_id).delete()
            extra.delete()
    return n


def _drop_workspace(ws: Any) -> None:
    """Delete a workspace with all its rows, set-based (the ORM cascade would load 1M rows)."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as c:
        c.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'workspace_id'"
            if connection.vendor == "postgresql"
            else "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) p "
            "WHERE m.type = 'table' AND p.name = 'workspace_id'"
        )
        tables = {row[0] for row in c.fetchall()}
        if connection.vendor == "postgresql":
            # Every child row goes explicitly (below), so the per-row foreign-key checks of a
            # million deletions (queued to COMMIT, minutes) are redundant: skip them if allowed.
            c.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            if c.fetchone()[0]:
                c.execute("SET LOCAL session_replication_role = replica")
            else:
                c.execute("SET CONSTRAINTS ALL DEFERRED")
        # Children first: rows pointing at entries, then entries, then everything else.
        order = [
            "memory_entry_tags",
            "maintenance_dispute",
            "memory_relationship",
            "memory_codeanchor",
            "memory_entryaccess",
            "memory_tombstone",
            "memory_lifecycleevent",
        ]
        for table in ("memory_entry_tags", "memory_entryscore"):
            ids = "SELECT id FROM memory_entry WHERE workspace_id = %s"
            c.execute(f"DELETE FROM {table} WHERE entry_id IN ({ids})", [ws.pk])
        for table in order[1:]:
            if table in tables:
                c.execute(f"DELETE FROM {table} WHERE workspace_id = %s", [ws.pk])
        c.execute("UPDATE memory_entry SET supersedes_id = NULL WHERE workspace_id = %s", [ws.pk])
        c.execute("DELETE FROM memory_entry WHERE workspace_id = %s", [ws.pk])
    ws.delete()


def _entry_count_note(counts: dict[str, int]) -> str:
    return ", ".join(f"{v:,} {k}" for k, v in counts.items())


def _postgres_index_defs(cursor: Any, tables: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """Plain (non-constraint) indexes of each table: [(name, CREATE INDEX ...)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for table in tables:
        cursor.execute(
            """
            SELECT i.relname, pg_get_indexdef(i.oid)
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
            WHERE x.indrelid = %s::regclass
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
            ORDER BY i.relname
            """,
            [table],
        )
        out[table] = list(cursor.fetchall())
    return out


def _generate_postgresql(
    ws: Any, n: int, seed: int, batch_size: int, progress: Callable[[str], None]
) -> tuple[dict[str, float], dict[str, int]]:
    from django.db import connection, transaction

    from memory.policy_model import MaintenancePolicy
    from memory.scoring_db import refresh_scores

    phases: dict[str, float] = {}
    counts = {
        "entries": 0,
        "tags": 0,
        "entry_tags": 0,
        "links": 0,
        "anchors": 0,
        "accesses": 0,
        "events": 0,
        "tombstones": 0,
    }
    now = datetime.now(UTC).replace(microsecond=0)
    t = time.perf_counter()
    with transaction.atomic(), connection.cursor() as c:
        raw = c.cursor  # the psycopg cursor, for COPY
        c.execute("SET LOCAL maintenance_work_mem = '512MB'")
        c.execute("SET LOCAL synchronous_commit = off")
        # Check foreign keys at the end of each COPY rather than queueing millions of deferred
        # checks to commit (and CREATE INDEX refuses a table with pending trigger events).
        c.execute("SET CONSTRAINTS ALL IMMEDIATE")
        c.execute("LOCK TABLE memory_entry IN SHARE ROW EXCLUSIVE MODE")
        c.execute("SELECT coalesce(max(id), 0) FROM memory_entry")
        first_id = c.fetchone()[0] + 1
        defs = _postgres_index_defs(c, LOADED_TABLES)
        for table_defs in defs.values():
            for name, _ in table_defs:
                c.execute(f'DROP INDEX "{name}"')
        progress(
            f"dropped {sum(len(v) for v in defs.values())} secondary indexes for the load (same transaction)"
        )
        gen = RowGen(workspace_id=ws.pk, first_id=first_id, n=n, now=now, seed=seed)
        tag_ids = _copy_rows(raw, ws, gen, batch_size, counts, progress, t)
        counts["tags"] = len(tag_ids)
        max_id = first_id + n - 1
        c.execute("SELECT setval(pg_get_serial_sequence('memory_entry', 'id'), %s)", [max_id])
        phases["generate + COPY"] = time.perf_counter() - t
        progress(f"COPY done in {phases['generate + COPY']:.1f} s ({_entry_count_note(counts)})")

        t = time.perf_counter()
        for table in LOADED_TABLES[1:]:
            for _, sql in defs[table]:
                c.execute(sql)
        phases["indexes of the other tables"] = time.perf_counter() - t

        t = time.perf_counter()
        params = MaintenancePolicy.for_workspace(ws).decay_params
        scored = refresh_scores(ws, now=now, params=params, batch_size=10_000)
        phases["refresh_scores"] = time.perf_counter() - t
        progress(f"refresh_scores: {scored:,} rows in {phases['refresh_scores']:.1f} s")

        t = time.perf_counter()
        for _, sql in defs["memory_entry"]:
            c.execute(sql)
        phases["indexes of memory_entry"] = time.perf_counter() - t
        progress(f"memory_entry indexes rebuilt in {phases['indexes of memory_entry']:.1f} s")
        ws.name = f"datagen n={n} seed={seed} max_id={max_id}"
        ws.save(update_fields=["name"])

    t = time.perf_counter()
    with connection.cursor() as c:
        # The score UPDATE left a dead version of every row; a compact table is what a
        # vacuumed production table looks like (and what makes index-only scans possible).
        c.execute("SET maintenance_work_mem = '512MB'")
        c.execute("VACUUM FULL memory_entry")
        for table in (*LOADED_TABLES, "memory_entryscore"):  # the scores: written by refresh_scores
            c.execute(f"VACUUM ANALYZE {table}")
    phases["VACUUM FULL + ANALYZE"] = time.perf_counter() - t
    return phases, counts


def _count(counts: dict[str, int], b: Batch) -> None:
    """Add a batch's rows to the per-table counts."""
    for key, rows in (
        ("entries", b.entries),
        ("entry_tags", b.tags),
        ("links", b.links),
        ("anchors", b.anchors),
        ("accesses", b.accesses),
        ("events", b.events),
        ("tombstones", b.tombstones),
    ):
        counts[key] += len(rows)


def _copy_rows(
    raw: Any,
    ws: Any,
    gen: RowGen,
    batch_size: int,
    counts: dict[str, int],
    progress: Callable[[str], None],
    started: float,
) -> dict[str, int]:
    """COPY the rows of ``gen`` into the loaded tables (PostgreSQL), adding to ``counts``;
    the workspace's tag ids by name."""
    from memory.models import Tag

    tag_ids: dict[str, int] = {}
    done = 0
    last_log = time.perf_counter()
    for b in gen.batches(batch_size):
        new = sorted({name for _, name in b.tags if name not in tag_ids})
        if new:
            Tag.objects.bulk_create([Tag(workspace=ws, name=x) for x in new], ignore_conflicts=True)
            tag_ids.update(Tag.objects.filter(workspace=ws, name__in=new).values_list("name", "id"))
        _copy(raw, "memory_entry", ENTRY_COLUMNS, b.entries)
        _copy(raw, "memory_entry_tags", ("entry_id", "tag_id"), [(e, tag_ids[x]) for e, x in b.tags])
        _copy(raw, "memory_relationship", LINK_COLS, b.links)
        _copy(raw, "memory_codeanchor", ANCHOR_COLS, b.anchors)
        _copy(raw, "memory_entryaccess", ACCESS_COLS, b.accesses)
        _copy(raw, "memory_lifecycleevent", EVENT_COLS, b.events)
        _copy(raw, "memory_tombstone", TOMBSTONE_COLS, b.tombstones)
        _count(counts, b)
        done += len(b.entries)
        if time.perf_counter() - last_log > 15:
            last_log = time.perf_counter()
            rate = done / (last_log - started)
            progress(f"copied {done:,} entries ({rate:,.0f}/s)")
    counts["tags"] += len(tag_ids)
    return tag_ids


MANY_MARK = re.compile(r"^datagen-many (\d+)x(\d+) seed=(\d+)$")


def ensure_many(
    workspaces: int, n: int, *, prefix: str = "fleet", seed: int = 1, progress: Callable[[str], None] = log
) -> list[int]:
    """Workspaces ``<prefix>-0001`` … each holding the same mix of N generated entries (each its
    own seed), on PostgreSQL; their ids. Reused when the first one's name says the same
    counts; otherwise every ``<prefix>-*`` workspace is dropped and the set rebuilt. The rows
    are COPYed with the indexes in place (a workspace of thousands among a million rows: an
    index rebuild per workspace would cost more than the load), scored per workspace, and the
    tables analysed once at the end."""
    from django.db import connection, transaction

    from memory import accounts
    from memory.models import Workspace
    from memory.policy_model import MaintenancePolicy
    from memory.scoring_db import refresh_scores

    if connection.vendor != "postgresql":
        raise SystemExit("ensure_many generates on PostgreSQL only")
    mark = f"datagen-many {workspaces}x{n} seed={seed}"
    existing = Workspace.objects.filter(slug__startswith=f"{prefix}-").order_by("slug")
    names = list(existing.values_list("name", flat=True))
    if len(names) == workspaces and all(name == mark for name in names):
        return list(existing.values_list("pk", flat=True))
    for ws in existing:
        _drop_workspace(ws)
    now = datetime.now(UTC).replace(microsecond=0)
    counts = dict.fromkeys(
        ("entries", "tags", "entry_tags", "links", "anchors", "accesses", "events", "tombstones"), 0
    )
    t = time.perf_counter()
    ids = []
    for k in range(workspaces):
        ws = accounts.workspace_create(slug=f"{prefix}-{k + 1:04d}", name=f"{mark} (incomplete)")
        with transaction.atomic(), connection.cursor() as c:
            c.execute("SET LOCAL synchronous_commit = off")
            c.execute("LOCK TABLE memory_entry IN SHARE ROW EXCLUSIVE MODE")
            c.execute("SELECT coalesce(max(id), 0) FROM memory_entry")
            first_id = c.fetchone()[0] + 1
            gen = RowGen(workspace_id=ws.pk, first_id=first_id, n=n, now=now, seed=seed + k)
            _copy_rows(c.cursor, ws, gen, 20_000, counts, lambda _msg: None, time.perf_counter())
            c.execute("SELECT setval(pg_get_serial_sequence('memory_entry', 'id'), %s)", [first_id + n - 1])
            refresh_scores(
                ws, now=now, params=MaintenancePolicy.for_workspace(ws).decay_params, batch_size=10_000
            )
            ws.name = mark
            ws.save(update_fields=["name"])
        ids.append(ws.pk)
        if (k + 1) % 20 == 0:
            progress(f"{k + 1}/{workspaces} workspaces ({time.perf_counter() - t:.0f} s)")
    with connection.cursor() as c:
        for table in (*LOADED_TABLES, "memory_entryscore"):  # the scores: written by refresh_scores
            c.execute(f"VACUUM ANALYZE {table}")
    progress(
        f"generated {workspaces} x {n:,} entries in {time.perf_counter() - t:.1f} s"
        f" ({_entry_count_note(counts)})"
    )
    return ids


def _copy(raw: Any, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    cols = ", ".join(f'"{c}"' for c in columns)
    with raw.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)


def _generate_sqlite(
    ws: Any, n: int, seed: int, batch_size: int, progress: Callable[[str], None]
) -> tuple[dict[str, float], dict[str, int]]:
    from django.db import connection, transaction

    from memory.models import Tag
    from memory.policy_model import MaintenancePolicy
    from memory.scoring_db import refresh_scores

    phases: dict[str, float] = {}
    counts = {
        "entries": 0,
        "tags": 0,
        "entry_tags": 0,
        "links": 0,
        "anchors": 0,
        "accesses": 0,
        "events": 0,
        "tombstones": 0,
    }
    now = datetime.now(UTC).replace(microsecond=0)
    ops = connection.ops
    t = time.perf_counter()

    def dt(v: Any) -> Any:
        return ops.adapt_datetimefield_value(v) if isinstance(v, datetime) else v

    def insert(c: Any, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]) -> None:
        if rows:
            sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
            c.executemany(sql, [tuple(dt(v) for v in row) for row in rows])

    with transaction.atomic(), connection.cursor() as c:
        c.execute("SELECT coalesce(max(id), 0) FROM memory_entry")
        first_id = c.fetchone()[0] + 1
        gen = RowGen(workspace_id=ws.pk, first_id=first_id, n=n, now=now, seed=seed)
        tag_ids: dict[str, int] = {}
        for b in gen.batches(batch_size):
            new = sorted({name for _, name in b.tags if name not in tag_ids})
            if new:
                Tag.objects.bulk_create([Tag(workspace=ws, name=x) for x in new], ignore_conflicts=True)
                tag_ids.update(Tag.objects.filter(workspace=ws, name__in=new).values_list("name", "id"))
            insert(c, "memory_entry", [f'"{x}"' for x in ENTRY_COLUMNS], b.entries)
            insert(c, "memory_entry_tags", ("entry_id", "tag_id"), [(e, tag_ids[x]) for e, x in b.tags])
            insert(c, "memory_relationship", LINK_COLS, b.links)
            insert(c, "memory_codeanchor", [f'"{x}"' for x in ANCHOR_COLS], b.anchors)
            insert(c, "memory_entryaccess", [f'"{x}"' for x in ACCESS_COLS], b.accesses)
            insert(c, "memory_lifecycleevent", EVENT_COLS, b.events)
            insert(c, "memory_tombstone", TOMBSTONE_COLS, b.tombstones)
            _count(counts, b)
        counts["tags"] = len(tag_ids)
        phases["generate + INSERT"] = time.perf_counter() - t
        t = time.perf_counter()
        params = MaintenancePolicy.for_workspace(ws).decay_params
        refresh_scores(ws, now=now, params=params, batch_size=5_000)
        phases["refresh_scores"] = time.perf_counter() - t
        ws.name = f"datagen n={n} seed={seed} max_id={first_id + n - 1}"
        ws.save(update_fields=["name"])
    t = time.perf_counter()
    with connection.cursor() as c:
        c.execute("ANALYZE")
    phases["ANALYZE"] = time.perf_counter() - t
    return phases, counts


def setup_django(database_url: str | None) -> None:
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", help="database (default: DATABASE_URL or the project's SQLite file)"
    )
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--workspace", help=f"workspace slug (default {DEFAULT_SLUG}-<N>)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--regenerate", action="store_true", help="rebuild even if the workspace is current")
    parser.add_argument(
        "--sample", type=int, default=0, help="print N generated texts and queries, then exit"
    )
    args = parser.parse_args()
    if args.sample:
        g = TextGen(seed=args.seed)
        for _ in range(args.sample):
            e = g.entry()
            print(json.dumps({"type": e.entry_type, "title": e.title, "tags": e.tags, "content": e.content}))
        print("queries:", [g.query() for _ in range(args.sample)])
        return 0
    setup_django(args.database_url)
    res = ensure(args.entries, slug=args.workspace, seed=args.seed, regenerate=args.regenerate)
    if res.reused:
        print(
            f"workspace {res.slug!r} already holds the {res.entries:,} generated entries (use --regenerate)"
        )
    else:
        print(f"workspace {res.slug!r}: {res.entries:,} entries generated in {res.seconds:.1f} s")
        print("  " + _entry_count_note(res.counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
