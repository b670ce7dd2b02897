"""Memory Steward settings: one file, every deployment choice read from the environment.

Embedded mode (the default) runs on a SQLite file under ``var/``; hosted mode sets
``DATABASE_URL=postgres://...`` and ``REDIS_URL``. Bad values fail loudly at start-up rather
than being half-understood.
"""

import json
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DJANGO_DEBUG", True)

# In DEBUG a fixed development key is acceptable; anything else must bring its own secret.
SECRET_KEY = os.environ.get("SECRET_KEY") or ""
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DJANGO_DEBUG is off")
    SECRET_KEY = "django-insecure-dev-only-memory-steward-key-do-not-use-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
PORT = env_int("PORT", 8000)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "template_partials",
    "ninja",
    "memory",
    "maintenance",
    "console",
    "cli",  # before django_q: its qcluster command replaces django-q2's
    "django_q",
]

MIDDLEWARE = [
    "config.middleware.api_json_errors",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.live.context",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
# DATABASE_URL takes sqlite:///path (relative paths are under the project) or postgres://...
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
if DATABASE_URL.startswith("sqlite:///") and not DATABASE_URL.startswith("sqlite:////"):
    _path = DATABASE_URL.removeprefix("sqlite:///")
    if _path and _path != ":memory:":
        DATABASE_URL = f"sqlite:///{BASE_DIR / _path}"
try:
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0))
except ValueError as exc:  # unknown scheme
    raise ImproperlyConfigured(f"DATABASE_URL is not understood: {exc}") from None
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web server read while the q2 cluster writes; the busy timeout turns a
    # momentary writer collision into a short wait instead of "database is locked".
    _db["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    if _db["NAME"] != ":memory:":
        Path(_db["NAME"]).parent.mkdir(parents=True, exist_ok=True)
elif _db["ENGINE"] == "django.db.backends.postgresql" and env_bool("DB_POOL", True):
    # A connection per request costs a backend start with cold caches, on every request
    # (bench/reports/api.md, section "Figures moved from the code"). Under ASGI each request
    # runs in a new thread, so CONN_MAX_AGE > 0 would leave one connection open per request;
    # Django's psycopg pool hands it back at the end of the request instead. Keep
    # DB_POOL_MAX × processes below max_connections.
    _db["CONN_MAX_AGE"] = 0
    _db["OPTIONS"] = {
        "pool": {
            "min_size": env_int("DB_POOL_MIN", 1),
            "max_size": env_int("DB_POOL_MAX", 10),
            "timeout": 10,
        },
        # JIT compilation adds time to a large query and pays off only for analytics
        # (bench/reports/api.md, section "Figures moved from the code").
        "options": "-c jit=off",
    }
    if env_bool("DB_PREPARED", True):
        # Parameters bound by the server, and a statement run 5 times on a connection is
        # prepared there (psycopg's prepare_threshold): PostgreSQL stops parsing and planning
        # the API's repeated statements on every request (bench/reports/api.md, section
        # "Figures moved from the code"). Set DB_PREPARED=0 behind a pooler that cannot
        # keep prepared statements (PgBouncer in transaction mode before 1.21, or without
        # max_prepared_statements).
        _db["OPTIONS"].update(server_side_binding=True, prepare_threshold=5)
if _db["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, reading timestamps with psycopg's compiled loader (config/postgresql).
    _db["ENGINE"] = "config.postgresql"
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where collectstatic writes (and WhiteNoise serves from without DEBUG); STATIC_ROOT moves it.
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT") or VAR_DIR / "staticfiles")
STORAGES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
# Without collectstatic (embedded mode) WhiteNoise serves straight from the finders.
WHITENOISE_USE_FINDERS = DEBUG
if DEBUG:
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns at start-up without it

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/console/"
# Logging out leads back to the console's login page, not to the admin's "Logged out" page.
LOGOUT_REDIRECT_URL = LOGIN_URL

# --- Live updates ---------------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 gives every connection a 5 s read timeout, and channels-redis waits
            # for a websocket's next message with a blocking pop of 5 s: the read timed out as
            # the pop returned, the consumer died and the live page's websocket closed after
            # 5 idle seconds (seen by tests/test_hosted.py). Reads may wait longer than a pop.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Scheduled work (django-q2) ----------------------------------------------------------------
# The ORM broker needs nothing beyond the database; hosted mode may use Redis instead.
Q_CLUSTER = {
    "name": "memory-steward",
    "workers": env_int("Q_WORKERS", 2),
    "timeout": env_int("Q_TIMEOUT", 1800),
    "retry": env_int("Q_TIMEOUT", 1800) + 60,  # must exceed timeout or tasks run twice
    "max_attempts": 1,
    "catch_up": False,
    "save_limit": 500,
    "poll": 2,
    "label": "Scheduled tasks",
}
# django-q2 keeps the newest save_limit successful task results; failed ones it keeps for ever.
# After each scheduled full run the worker trims those to the newest Q_FAILURES_KEEP, none older than
# Q_FAILURES_KEEP_DAYS (maintenance.tasks.reclaim_worker_rows).
Q_FAILURES_KEEP = env_int("Q_FAILURES_KEEP", 500)
Q_FAILURES_KEEP_DAYS = env_int("Q_FAILURES_KEEP_DAYS", 30)
if REDIS_URL and env_bool("Q_REDIS_BROKER", False):
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# --- Memory Steward ---------------------------------------------------------------------------
# A dry run of a workspace with at most this many latest entries answers in the request; a
# larger one (like every real run) is queued for the django-q2 worker (api.maintenance).
MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES = env_int("MAINTENANCE_INLINE_DRY_RUN_MAX_ENTRIES", 2000)
# PostgreSQL: the connections that write one pass's batches of a run at once
# (maintenance.batch_workers); 1 writes them one after the other.
MAINTENANCE_BATCH_WORKERS = env_int("MAINTENANCE_BATCH_WORKERS", 2)
# On SQLite a run's plan works on a temporary copy of the database, so API writes never wait
# for it (maintenance.plan_snapshot); 0 plans inside the database under its write lock.
PLAN_SNAPSHOT = env_bool("PLAN_SNAPSHOT", True)
PLAN_SNAPSHOT_DIR = os.environ.get("PLAN_SNAPSHOT_DIR") or None  # default: the database's folder
BACKUP_DIR = Path(os.environ.get("BACKUP_DIR") or VAR_DIR / "backups")
if not BACKUP_DIR.is_absolute():
    BACKUP_DIR = BASE_DIR / BACKUP_DIR
# Backups are written, rotated and read through the "backups" storage: FileSystemStorage on
# BACKUP_DIR unless BACKUP_STORAGE_BACKEND names another Django storage backend (e.g.
# django-storages' storages.backends.s3.S3Storage, installed separately) with its options as a
# JSON object in BACKUP_STORAGE_OPTIONS. Several machines need a storage they all reach.


def backup_storage(environ: Any) -> dict[str, Any]:
    """The "backups" entry of STORAGES that ``environ`` describes."""
    backend = (environ.get("BACKUP_STORAGE_BACKEND") or "").strip()
    try:
        options = json.loads(environ.get("BACKUP_STORAGE_OPTIONS") or "{}")
    except ValueError as exc:
        raise ImproperlyConfigured(f"BACKUP_STORAGE_OPTIONS is not JSON: {exc}") from None
    if not isinstance(options, dict):
        raise ImproperlyConfigured("BACKUP_STORAGE_OPTIONS must be a JSON object")
    return {"BACKEND": backend or "maintenance.storage.BackupDirStorage", "OPTIONS": options}


STORAGES["backups"] = backup_storage(os.environ)

# --- Production hardening -------------------------------------------------------------------
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    # A load balancer checks its backends on plain HTTP, behind the TLS it terminates.
    SECURE_REDIRECT_EXEMPT = [r"^api/v1/health$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading commits the whole domain and its subdomains to HTTPS in every browser,
        # a decision about the domain, not this app: off unless asked for, and check --deploy
        # is not told to nag about it (README, "Hosted deployment").
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
    SECURE_CONTENT_TYPE_NOSNIFF = True

# --- Content-Security-Policy ----------------------------------------------------------------
# Every response, in every mode but Django's own 404 and 500 pages under DEBUG (django-csp:
# Django 5.2 has no CSP of its own; 6.0's SECURE_CSP takes the same directives, so moving to
# it is a rename). No style-src-attr exception either: no page needs a style="" attribute
# (the charts are SVG styled by classes; the admin sets styles from its scripts, which a CSP
# allows). The console, the admin and the API
# docs load scripts and styles from this site's static files only: no inline <script>, no
# on…= or hx-on attribute (the console's few behaviours are in static/js/console.js), no
# <style> element or style="" attribute, no eval (no htmx trigger filter or js: value), and
# nothing from another origin (no CDN). 'self' in connect-src covers the live websocket of
# the same host and port (ws: and wss:, as CSP Level 3 browsers match it), without opening
# websockets to any other host. The JSON API gets the same header: harmless for JSON, and a
# browser opening an API answer runs nothing. frame-ancestors 'none' is the modern
# X-Frame-Options: DENY (both are sent). Images may also be data: URLs (the API docs'
# stylesheet draws its menu arrow as one; an image runs nothing).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "frame-ancestors": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# --- API ------------------------------------------------------------------------------------
API_RATE_LIMIT_PER_MINUTE = env_int("API_RATE_LIMIT_PER_MINUTE", 600)
# The URL MCP clients use for the /mcp endpoint (named by its protected-resource metadata);
# empty: http://127.0.0.1:PORT/mcp, right for a local `make run`. Hosted: https://<name>/mcp.
MCP_PUBLIC_URL = os.environ.get("MCP_PUBLIC_URL", "")
# Rate-limit counters: shared through Redis in hosted mode, per process otherwise.
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
