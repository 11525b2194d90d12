"""The pieces of remote sources that need no server: brace URLs, options, redaction."""

import logging

import pytest

from shardfs.storage import remote
from shardfs.view.sources import expand_braces
from shardfs.service.config import MountConfig, apply_options, parse_config
from shardfs.errors import UsageError


def test_brace_ranges_as_webdataset_writes_them():
    urls = expand_braces("https://h/p/train-{000000..000146}.tar")
    assert len(urls) == 147 and urls[0] == "https://h/p/train-000000.tar" and urls[-1].endswith("-000146.tar")
    assert expand_braces("s3://b/{a,b}-{1..2}.tar") == ["s3://b/a-1.tar", "s3://b/a-2.tar",
                                                               "s3://b/b-1.tar", "s3://b/b-2.tar"]
    assert expand_braces("http://h/x.tar") == ["http://h/x.tar"]
    with pytest.raises(UsageError):
        expand_braces("http://h/{x}.tar")


def test_options_are_typed_and_secrets_redacted(monkeypatch):
    assert remote.parse_option("anon=true") == ("anon", True)
    assert remote.parse_option("endpoint_url=http://h:9000") == ("endpoint_url", "http://h:9000")
    assert remote.parse_option('client_kwargs={"region_name": "eu"}') == ("client_kwargs", {"region_name": "eu"})
    with pytest.raises(UsageError):
        remote.parse_option("novalue")
    remote.configure({"key": "AKIDEXAMPLE", "secret": "s3cr3t-value", "client_kwargs": {"aws_session_token": "tok-123"},
                      "endpoint_url": "http://h:9000"})
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-the-environment")
    text = ("AKIDEXAMPLE s3cr3t-value tok-123 from-the-environment https://user:pw@h/x.tar "
            "http://h/x?X-Amz-Signature=abcdef&b=1 http://h:9000")
    assert remote.redact(text) == "*** *** *** *** https://***@h/x.tar http://h/x?X-Amz-Signature=***&b=1 http://h:9000"
    assert remote.redact_options({"secret": "x", "anon": True}) == {"secret": "***", "anon": True}
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed with %s", ("s3cr3t-value",), None)
    remote.RedactingFilter().filter(record)
    assert record.getMessage() == "failed with ***"
    remote.configure({})


def test_storage_options_in_toml_and_fstab_form():
    cfg = parse_config({"sources": ["s3://b/p/"], "mountpoint": "/m",
                        "storage_options": {"endpoint_url": "http://h:9000", "anon": True}})
    assert cfg.storage_options == {"endpoint_url": "http://h:9000", "anon": True}
    with pytest.raises(UsageError, match="storage_options: expected a table"):
        parse_config({"sources": ["/d"], "mountpoint": "/m", "storage_options": "x"})
    cfg = MountConfig(sources=["s3://b/"], mountpoint="/m")
    apply_options(cfg, "ro,storage_options.endpoint_url=http://h:9000,storage_options.anon=true,loaders=4")
    assert cfg.storage_options == {"endpoint_url": "http://h:9000", "anon": True} and cfg.loaders == 4
    with pytest.raises(UsageError) as exc:
        apply_options(cfg, "secret=hunter22")
    assert "hunter22" not in str(exc.value)
