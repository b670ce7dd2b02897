"""Errors raised by services; the API maps each to its HTTP status and one JSON shape."""

from typing import Any


class ServiceError(Exception):
    status_code = 400

    def __init__(self, detail: str, **fields: Any):
        super().__init__(detail)
        self.detail = detail
        # Answered beside ``detail``: what a client needs to act on the refusal (ids).
        self.fields = fields


class InvalidInput(ServiceError):
    status_code = 422


class NotFound(ServiceError):
    status_code = 404


class Conflict(ServiceError):
    status_code = 409


class Forbidden(ServiceError):
    status_code = 403


class Unavailable(ServiceError):
    """A service the request needs (the task queue's broker) refused it; the caller may retry."""

    status_code = 503
