"""The `s3server` fixture (tests/s3server.py): a real versitygw answering
signed S3 requests on 127.0.0.1, objects stored as plain files, stop/start
on the same port and data dir. The tiered-storage tests build on these
guarantees, so each one is checked here against the running server.

Without versitygw these tests are skipped, unless CI=true, where they fail.
"""
from __future__ import annotations

import base64
import hashlib

import pytest

KEY = "orders-0/00000000000000000000.log"
# Every byte value, not a multiple of any buffer size.
DATA = bytes(range(256)) * 1000 + b"tail"


def test_signed_put_get_ranged_get_list(s3server):
    s3 = s3server.client()
    etag = s3.put(s3server.bucket, KEY, DATA)
    # versitygw's ETag for a single PUT is S3's: the quoted hex MD5.
    assert etag == f'"{hashlib.md5(DATA).hexdigest()}"'

    assert s3.get(s3server.bucket, KEY) == DATA
    for first, last in [(0, 0), (1000, 1999), (len(DATA) - 1, len(DATA) - 1)]:
        assert s3.get(s3server.bucket, KEY, (first, last)) == DATA[first:last + 1], (first, last)
    r = s3.request("GET", s3server.bucket, KEY, headers={"Range": "bytes=10-19"})
    assert r.headers["content-range"] == f"bytes 10-19/{len(DATA)}"

    s3.put(s3server.bucket, "orders-1/00000000000000000000.log", b"other partition")
    listed = s3.list(s3server.bucket, prefix="orders-0/")
    assert [(o.key, o.size, o.etag) for o in listed] == [(KEY, len(DATA), etag)]
    assert {o.key for o in s3.list(s3server.bucket)} == {KEY, "orders-1/00000000000000000000.log"}

    # The object is a plain file at <data_dir>/<bucket>/<key>.
    assert s3server.object_path(KEY) == s3server.data_dir / s3server.bucket / KEY
    assert s3server.object_path(KEY).read_bytes() == DATA
    assert s3server.object_keys() == sorted([KEY, "orders-1/00000000000000000000.log"])

    s3.delete(s3server.bucket, KEY)
    assert s3.request("GET", s3server.bucket, KEY).status == 404
    assert not s3server.object_path(KEY).exists()
    # Emptied key "directories" go with their last object.
    assert not (s3server.bucket_dir / "orders-0").exists()


def test_wrong_secret_is_refused(s3server):
    s3server.client().put(s3server.bucket, KEY, DATA)
    bad = s3server.client(secret_key="not-the-secret")
    assert bad.request("GET", s3server.bucket, KEY).status == 403
    assert bad.request("PUT", s3server.bucket, "x", body=b"x").status == 403
    assert s3server.object_keys() == [KEY]


def test_stop_and_start_keep_endpoint_and_objects(s3server):
    s3 = s3server.client()
    s3.put(s3server.bucket, KEY, DATA)
    endpoint = s3server.endpoint

    s3server.stop()
    assert not s3server.alive()
    with pytest.raises(ConnectionRefusedError):
        s3.request("GET", s3server.bucket, KEY)
    assert s3server.object_path(KEY).read_bytes() == DATA

    s3server.start()
    assert s3server.endpoint == endpoint
    assert s3.get(s3server.bucket, KEY) == DATA

    s3server.kill9()
    s3server.start()
    assert s3.get(s3server.bucket, KEY) == DATA


def test_corrupting_the_file_changes_what_get_returns(s3server):
    s3 = s3server.client()
    etag = s3.put(s3server.bucket, KEY, DATA)
    path = s3server.object_path(KEY)
    corrupt = bytearray(DATA)
    corrupt[5000] ^= 0xFF
    path.write_bytes(bytes(corrupt))  # in place: keeps the file's xattrs

    assert s3.get(s3server.bucket, KEY) == bytes(corrupt)
    assert s3.get(s3server.bucket, KEY, (4990, 5009)) == bytes(corrupt[4990:5010])
    # The ETag is stored beside the data (an xattr), so it still claims the
    # original bytes: only a client-side CRC notices this corruption.
    assert s3.request("HEAD", s3server.bucket, KEY).headers["etag"] == etag


def test_conditional_put(s3server):
    """What object_store's PutMode::Create (If-None-Match: *) and
    PutMode::Update (If-Match: <etag>) rely on."""
    s3 = s3server.client()
    b = s3server.bucket
    assert s3.request("PUT", b, "manifest", body=b"v1", headers={"If-None-Match": "*"}).status == 200
    r = s3.request("PUT", b, "manifest", body=b"v1'", headers={"If-None-Match": "*"})
    assert r.status == 412, r.body
    v1 = s3.request("HEAD", b, "manifest").headers["etag"]
    assert s3.request("PUT", b, "manifest", body=b"v2", headers={"If-Match": v1}).status == 200
    r = s3.request("PUT", b, "manifest", body=b"v3", headers={"If-Match": v1})
    assert r.status == 412, r.body
    assert s3.get(b, "manifest") == b"v2"


def test_checksum_mismatch_is_refused(s3server):
    s3 = s3server.client()

    def sha256_b64(data: bytes) -> str:
        return base64.b64encode(hashlib.sha256(data).digest()).decode()
    r = s3.request("PUT", s3server.bucket, KEY, body=DATA,
                   headers={"x-amz-checksum-sha256": sha256_b64(DATA + b"!")})
    assert r.status == 400 and b"BadDigest" in r.body, (r.status, r.body)
    assert s3server.object_keys() == []
    r = s3.request("PUT", s3server.bucket, KEY, body=DATA,
                   headers={"x-amz-checksum-sha256": sha256_b64(DATA)})
    assert r.status == 200, r.body
    assert r.headers["x-amz-checksum-sha256"] == sha256_b64(DATA)
