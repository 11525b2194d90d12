"""Credentials never shown: storage options and environment secrets are replaced by ``***`` in
logs, status, stats and error messages (whatever library wrote the message)."""

from __future__ import annotations

import logging
import os
import re

_SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth", "signature", "session")
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_secrets: set[str] = set()
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_QUERY_SECRET = re.compile(r"(?i)([?&][^=&\s]*(?:signature|credential|token|key|secret)[^=&\s]*=)[^&\s]+")


def is_secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


def remember_secrets(value, key: str = "") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            remember_secrets(v, str(k) if is_secret(str(k)) else key)
    elif isinstance(value, (list, tuple)):
        for v in value:
            remember_secrets(v, key)
    elif key and value not in (None, "", True, False) and len(str(value)) >= 4:
        _secrets.add(str(value))


def redact(text: str) -> str:
    """``text`` without credentials: known secret values, user:password@ in URLs, signed-URL queries."""
    for env in _SECRET_ENV:
        value = os.environ.get(env)
        if value and len(value) >= 4:
            _secrets.add(value)
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_USERINFO.sub("***@", text)
    return _QUERY_SECRET.sub(r"\1***", text)


def redact_options(options: dict) -> dict:
    return {k: ("***" if is_secret(k) else v) for k, v in options.items()}


class RedactingFilter(logging.Filter):
    """On every log handler: whatever a message says (ours, botocore's, aiohttp's), no credentials."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
