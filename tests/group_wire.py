"""Hand-encoded group coordinator requests (non-flexible versions), for
checking Kafka's error codes where real clients would hide them."""
from __future__ import annotations

from kafka_wire import Conn, Reader, frame, header_v1, i16, i32, i64, nbytes, string

JOIN_V = 5
SYNC_V = 3
HEARTBEAT_V = 3
COMMIT_V = 7
LEAVE_V = 3


class GroupConn(Conn):
    """One client connection to the coordinator, one request at a time."""

    correlation = 0

    def call(self, api_key: int, version: int, body: bytes) -> Reader:
        self.correlation += 1
        self.send(frame(header_v1(api_key, version, self.correlation) + body))
        return self.reply()

    def send_only(self, api_key: int, version: int, body: bytes) -> None:
        self.correlation += 1
        self.send(frame(header_v1(api_key, version, self.correlation) + body))

    def reply(self) -> Reader:
        cid, body = self.recv_response()
        assert cid == self.correlation, f"correlation {cid} != {self.correlation}"
        return Reader(body)

    def join(self, group: str, member_id: str = "", instance: str | None = None,
             session_ms: int = 10000, protocols=(("range", b"meta"),)) -> dict:
        self.send_only(11, JOIN_V, join_body(group, member_id, instance, session_ms, protocols))
        return self.join_reply()

    def join_reply(self) -> dict:
        r = self.reply()
        r.i32()
        out = {"error": r.i16(), "generation": r.i32(), "protocol": r.string(),
               "leader": r.string(), "member_id": r.string(), "members": []}
        for _ in range(r.i32()):
            out["members"].append((r.string(), r.string(), r.bytes_()))
        return out

    def sync(self, group: str, generation: int, member_id: str, instance: str | None = None,
             assignments=()) -> tuple[int, bytes]:
        body = string(group) + i32(generation) + string(member_id) + string(instance)
        body += i32(len(assignments)) + b"".join(string(m) + nbytes(a) for m, a in assignments)
        r = self.call(14, SYNC_V, body)
        r.i32()
        return r.i16(), r.bytes_()

    def heartbeat(self, group: str, generation: int, member_id: str, instance: str | None = None) -> int:
        r = self.call(12, HEARTBEAT_V, string(group) + i32(generation) + string(member_id) + string(instance))
        r.i32()
        return r.i16()

    def commit(self, group: str, generation: int, member_id: str, topic: str, partition: int,
               offset: int) -> int:
        body = string(group) + i32(generation) + string(member_id) + string(None)
        body += i32(1) + string(topic) + i32(1) + i32(partition) + i64(offset) + i32(-1) + string("")
        r = self.call(8, COMMIT_V, body)
        r.i32()
        assert r.i32() == 1 and r.string() == topic and r.i32() == 1
        r.i32()
        return r.i16()

    def leave(self, group: str, member_id: str) -> tuple[int, int]:
        body = string(group) + i32(1) + string(member_id) + string(None)
        r = self.call(13, LEAVE_V, body)
        r.i32()
        top = r.i16()
        assert r.i32() == 1
        r.string(), r.string()
        return top, r.i16()


def join_body(group: str, member_id: str, instance: str | None, session_ms: int, protocols) -> bytes:
    body = string(group) + i32(session_ms) + i32(30000) + string(member_id) + string(instance)
    body += string("consumer") + i32(len(protocols))
    body += b"".join(string(name) + nbytes(meta) for name, meta in protocols)
    return body


# Kafka's error codes used by the group tests.
NONE = 0
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
