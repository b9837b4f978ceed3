"""A tiny S3 client on the Python standard library (AWS Signature Version 4,
path-style addressing), enough for tests to check what Keel put in the
object store through the S3 API itself: PUT, GET (ranged), HEAD, DELETE,
ListObjectsV2 and CreateBucket.

Deliberately small: no retries, no multipart, no chunked payload signing.
Every request signs the SHA-256 of its whole body, so a server that does
not check signatures or payload hashes is caught by the tests that send a
bad one.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
# RFC 3986 unreserved characters; SigV4 percent-encodes everything else.
_UNRESERVED = "-_.~"


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def xml(self) -> ET.Element:
        return ET.fromstring(self.body)


@dataclass
class ListedObject:
    key: str
    size: int
    etag: str


@dataclass
class S3Client:
    endpoint: str  # "http://127.0.0.1:port"
    region: str
    access_key: str
    secret_key: str
    timeout_s: float = 30.0
    _host: str = field(init=False)

    def __post_init__(self):
        u = urllib.parse.urlsplit(self.endpoint)
        assert u.scheme == "http" and u.hostname == "127.0.0.1", \
            f"tests only talk to a local S3 server over http, not {self.endpoint}"
        self._host = u.netloc

    # ------------------------------------------------------------ requests

    def request(self, method: str, bucket: str, key: str = "", *,
                query: dict[str, str] | None = None, body: bytes = b"",
                headers: dict[str, str] | None = None) -> Response:
        """One signed request; returns whatever the server answered (no
        status check, so tests can assert on errors too)."""
        path = "/" + _quote(bucket, safe="")
        if key:
            path += "/" + _quote(key, safe="/")
        query = dict(query or {})
        canonical_query = "&".join(f"{_quote(k, safe='')}={_quote(v, safe='')}"
                                   for k, v in sorted(query.items()))
        now = datetime.datetime.now(datetime.timezone.utc)
        hdrs = {k.lower(): v.strip() for k, v in (headers or {}).items()}
        hdrs["host"] = self._host
        hdrs["x-amz-date"] = now.strftime("%Y%m%dT%H%M%SZ")
        hdrs["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
        hdrs["authorization"] = self._authorization(method, path, canonical_query, hdrs, now)
        conn = http.client.HTTPConnection(self._host, timeout=self.timeout_s)
        try:
            url = path + (f"?{canonical_query}" if canonical_query else "")
            conn.request(method, url, body=body, headers=hdrs)
            r = conn.getresponse()
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    def _authorization(self, method: str, path: str, canonical_query: str,
                       hdrs: dict[str, str], now: datetime.datetime) -> str:
        signed = sorted(hdrs)
        canonical_request = "\n".join([
            method, path, canonical_query,
            "".join(f"{h}:{hdrs[h]}\n" for h in signed),
            ";".join(signed),
            hdrs["x-amz-content-sha256"],
        ])
        day = now.strftime("%Y%m%d")
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", hdrs["x-amz-date"], scope,
                             hashlib.sha256(canonical_request.encode()).hexdigest()])
        k = f"AWS4{self.secret_key}".encode()
        for part in (day, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        return (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
                f"SignedHeaders={';'.join(signed)}, Signature={sig}")

    # ------------------------------------------------------------ helpers

    def create_bucket(self, bucket: str) -> None:
        r = self.request("PUT", bucket)
        assert r.status == 200, f"CreateBucket {bucket}: {r.status} {r.body!r}"

    def head_bucket(self, bucket: str) -> int:
        return self.request("HEAD", bucket).status

    def put(self, bucket: str, key: str, data: bytes,
            headers: dict[str, str] | None = None) -> str:
        """PUT an object; returns its ETag (quotes included, as S3 sends it)."""
        r = self.request("PUT", bucket, key, body=data, headers=headers)
        assert r.status == 200, f"PUT {bucket}/{key}: {r.status} {r.body!r}"
        return r.headers["etag"]

    def get(self, bucket: str, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        """GET an object, or the inclusive byte range (first, last) of it."""
        headers = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else None
        r = self.request("GET", bucket, key, headers=headers)
        want = 206 if byte_range else 200
        assert r.status == want, f"GET {bucket}/{key} {headers}: {r.status} {r.body!r}"
        return r.body

    def delete(self, bucket: str, key: str) -> None:
        r = self.request("DELETE", bucket, key)
        assert r.status == 204, f"DELETE {bucket}/{key}: {r.status} {r.body!r}"

    def list(self, bucket: str, prefix: str = "") -> list[ListedObject]:
        """Every object under prefix (ListObjectsV2, following continuation tokens)."""
        out: list[ListedObject] = []
        token = None
        while True:
            q = {"list-type": "2", "prefix": prefix}
            if token:
                q["continuation-token"] = token
            r = self.request("GET", bucket, query=q)
            assert r.status == 200, f"ListObjectsV2 {bucket} {prefix!r}: {r.status} {r.body!r}"
            root = r.xml()
            for c in root.iter(f"{S3_NS}Contents"):
                out.append(ListedObject(key=c.findtext(f"{S3_NS}Key"),
                                        size=int(c.findtext(f"{S3_NS}Size")),
                                        etag=c.findtext(f"{S3_NS}ETag")))
            if root.findtext(f"{S3_NS}IsTruncated") != "true":
                return out
            token = root.findtext(f"{S3_NS}NextContinuationToken")


def _quote(s: str, safe: str) -> str:
    return urllib.parse.quote(s, safe=_UNRESERVED + safe)
