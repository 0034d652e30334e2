#!/usr/bin/python3
"""A redis-py session through hotkeyproxy, run by e2e/clients_test.go.

Usage: redis_py_session.py PORT [cluster] [acl]

Uses redis.Redis (RESP2) as an application would: PING, strings, binary
values, pipelines with and without MULTI/EXEC, WATCH, register_script with
its EVALSHA -> SCRIPT LOAD fallback, pub/sub across two connections, SELECT
through the db option, and server errors as redis.exceptions.ResponseError.
Prints each step, then OK; any mismatch raises and exits non-zero.

With "cluster" the proxy's upstream is a Redis Cluster: SELECT n gets
Redis Cluster's error instead, and keys in many slots and transactions on
one hash tag or across slots are tried too.

With "acl" Redis checks the proxy's logins (upstream.client_auth: redis):
the session creates a limited ACL user and logs in as it with the
username option, then checks Redis's NOPERM and WRONGPASS errors.
"""

import sys
import time

import redis
from redis.exceptions import (AuthenticationError, NoPermissionError, NoScriptError,
                              ResponseError, WatchError)


def expect(got, want, what):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


def step(name):
    print("step:", name, flush=True)


def main():
    opts = sys.argv[2:]
    if len(sys.argv) < 2 or len(set(opts)) != len(opts) or not set(opts) <= {"cluster", "acl"}:
        sys.exit("usage: redis_py_session.py PORT [cluster] [acl]")
    port = int(sys.argv[1])
    cluster, acl = "cluster" in opts, "acl" in opts
    print("redis-py", redis.__version__, flush=True)

    def client(**kw):
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10,
                           socket_connect_timeout=5, **kw)

    r = client()

    step("ping")
    expect(r.ping(), True, "PING")
    expect(r.echo(b"hello"), b"hello", "ECHO")

    step("set/get")
    expect(r.set("py:str", "value"), True, "SET")
    expect(r.get("py:str"), b"value", "GET")
    expect(r.set("py:str", "other", nx=True), None, "SET NX on existing key")
    expect(r.set("py:ttl", "v", ex=100), True, "SET EX")
    ttl = r.ttl("py:ttl")
    if not 0 < ttl <= 100:
        raise AssertionError("TTL: got %r, want 1..100" % ttl)
    expect(r.incrby("py:counter", 5), 5, "INCRBY")
    expect(r.get("py:missing"), None, "GET missing key")
    expect(r.delete("py:str", "py:missing"), 1, "DEL")

    step("binary values")
    blob = bytes(range(256)) + b"\r\n$3\r\n*1\r\n\x00"
    expect(r.set(b"py:bin:\x00\xff\r\n", blob), True, "SET binary")
    expect(r.get(b"py:bin:\x00\xff\r\n"), blob, "GET binary")
    expect(r.strlen(b"py:bin:\x00\xff\r\n"), len(blob), "STRLEN binary")
    big = bytes(i % 251 for i in range(1 << 20))
    expect(r.set("py:big", big), True, "SET 1 MiB")
    expect(r.get("py:big"), big, "GET 1 MiB")

    step("hash/list/set")
    expect(r.hset("py:h", mapping={"a": "1", "b": "2"}), 2, "HSET")
    expect(r.hgetall("py:h"), {b"a": b"1", b"b": b"2"}, "HGETALL")
    expect(r.rpush("py:l", "x", "y", "z"), 3, "RPUSH")
    expect(r.lrange("py:l", 0, -1), [b"x", b"y", b"z"], "LRANGE")
    expect(r.sadd("py:s", "m1", "m2", "m1"), 2, "SADD")
    expect(r.smembers("py:s"), {b"m1", b"m2"}, "SMEMBERS")

    step("pipeline without transaction")
    p = r.pipeline(transaction=False)
    for i in range(100):
        p.set("py:p:%d" % i, i)
    for i in range(100):
        p.get("py:p:%d" % i)
    p.incr("py:p:counter")
    p.lpush("py:p:0", "x")  # WRONGTYPE, reported in place
    res = p.execute(raise_on_error=False)
    expect(res[:100], [True] * 100, "pipeline SET replies")
    expect(res[100:200], [str(i).encode() for i in range(100)],
           "pipeline GET replies")
    expect(res[200], 1, "pipeline INCR")
    if not isinstance(res[201], ResponseError) or not str(res[201]).startswith("WRONGTYPE"):
        raise AssertionError("pipeline LPUSH on a string: got %r" % (res[201],))

    step("pipeline with transaction")
    p = r.pipeline(transaction=True)
    p.set("py:tx:a", "1").incr("py:tx:a").get("py:tx:a")
    expect(p.execute(), [True, 2, b"2"], "MULTI/EXEC")

    step("transaction with an error inside")
    p = r.pipeline(transaction=True)
    p.set("py:tx:b", "str").lpush("py:tx:b", "x").get("py:tx:b")
    try:
        p.execute()
        raise AssertionError("EXEC with a WRONGTYPE command did not raise")
    except ResponseError as e:
        if "WRONGTYPE" not in str(e):
            raise AssertionError("EXEC error: got %r, want WRONGTYPE" % str(e))
    expect(r.get("py:tx:b"), b"str", "SET inside the failed transaction applied")

    step("watch")
    r.set("py:w", "10")

    def add_one(pipe):
        v = int(pipe.get("py:w"))
        pipe.multi()
        pipe.set("py:w", v + 1)

    expect(r.transaction(add_one, "py:w"), [True], "transaction() helper")
    expect(r.get("py:w"), b"11", "value after transaction()")

    other = client()
    with r.pipeline() as pipe:
        pipe.watch("py:w")
        expect(pipe.get("py:w"), b"11", "GET while watching")
        other.set("py:w", "changed")  # another client writes the key
        pipe.multi()
        pipe.set("py:w", "mine")
        try:
            pipe.execute()
            raise AssertionError("EXEC after a watched key changed did not raise WatchError")
        except WatchError:
            pass
    expect(r.get("py:w"), b"changed", "value after aborted transaction")

    with r.pipeline() as pipe:
        pipe.watch("py:w")
        pipe.multi()
        pipe.set("py:w", "mine")
        expect(pipe.execute(), [True], "EXEC with an unchanged watched key")
    expect(r.get("py:w"), b"mine", "value after WATCH/EXEC")

    step("scripts")
    add = r.register_script(
        "return redis.call('INCRBY', KEYS[1], ARGV[1]) + 0")
    expect(add(keys=["py:sc"], args=[3]), 3, "script first call (EVALSHA fallback)")
    expect(r.script_exists(add.sha), [True], "SCRIPT EXISTS after first call")
    expect(add(keys=["py:sc"], args=[4]), 7, "script second call (EVALSHA)")
    expect(r.script_flush(), True, "SCRIPT FLUSH")
    expect(r.script_exists(add.sha), [False], "SCRIPT EXISTS after flush")
    expect(add(keys=["py:sc"], args=[1]), 8, "script call after SCRIPT FLUSH")
    sha = r.script_load("return {KEYS[1], ARGV[1]}")
    expect(r.evalsha(sha, 1, "k", "a"), [b"k", b"a"], "SCRIPT LOAD + EVALSHA")
    try:
        r.evalsha("0" * 40, 0)
        raise AssertionError("EVALSHA of an unknown script did not raise")
    except NoScriptError:
        pass
    r.script_flush()
    p = r.pipeline()
    add(keys=["py:sc"], args=[2], client=p)  # pipeline loads its scripts first
    p.get("py:sc")
    expect(p.execute(), [10, b"10"], "script in a pipeline")
    r.set("py:str:2", "s")
    try:
        r.eval("return redis.call('LPUSH', KEYS[1], 'x')", 1, "py:str:2")
        raise AssertionError("script WRONGTYPE did not raise")
    except ResponseError as e:
        if "WRONGTYPE" not in str(e):
            raise AssertionError("script error: got %r, want WRONGTYPE" % str(e))

    step("errors")
    r.set("py:e", "string")
    try:
        r.lpush("py:e", "x")
        raise AssertionError("LPUSH on a string did not raise")
    except ResponseError as e:
        if not str(e).startswith("WRONGTYPE"):
            raise AssertionError("LPUSH on a string: got %r" % str(e))
    try:
        r.execute_command("NOSUCHCOMMAND", "x")
        raise AssertionError("an unknown command did not raise")
    except ResponseError as e:
        if "unknown command" not in str(e):
            raise AssertionError("unknown command: got %r" % str(e))
    expect(r.ping(), True, "PING after errors")

    step("pub/sub")
    sub = client()
    ps = sub.pubsub()
    ps.subscribe("py:chan")
    msg = ps.get_message(timeout=5)
    expect(msg, {"type": "subscribe", "pattern": None, "channel": b"py:chan",
                 "data": 1}, "SUBSCRIBE confirmation")
    ps.psubscribe("py:pat:*")
    msg = ps.get_message(timeout=5)
    expect(msg, {"type": "psubscribe", "pattern": None, "channel": b"py:pat:*",
                 "data": 2}, "PSUBSCRIBE confirmation")
    expect(r.publish("py:chan", b"hi\x00there"), 1, "PUBLISH receivers")
    msg = ps.get_message(timeout=5)
    expect(msg, {"type": "message", "pattern": None, "channel": b"py:chan",
                 "data": b"hi\x00there"}, "message")
    expect(r.publish("py:pat:x", "p"), 1, "PUBLISH to pattern receivers")
    msg = ps.get_message(timeout=5)
    expect(msg, {"type": "pmessage", "pattern": b"py:pat:*",
                 "channel": b"py:pat:x", "data": b"p"}, "pmessage")
    ps.ping()
    msg = ps.get_message(timeout=5)
    expect(msg and msg["type"], "pong", "PING in subscribed mode")
    ps.unsubscribe("py:chan")
    msg = ps.get_message(timeout=5)
    expect(msg and (msg["type"], msg["channel"]), ("unsubscribe", b"py:chan"),
           "UNSUBSCRIBE confirmation")
    ps.punsubscribe()
    msg = ps.get_message(timeout=5)
    expect(msg and (msg["type"], msg["data"]), ("punsubscribe", 0),
           "PUNSUBSCRIBE confirmation")
    ps.close()
    expect(r.publish("py:chan", "nobody"), 0, "PUBLISH after unsubscribe")

    step("select")
    if cluster:
        r5 = client(db=5)
        try:
            r5.set("py:db", "five")
            raise AssertionError("a client with db=5 over a cluster did not raise")
        except ResponseError as e:
            if "SELECT is not allowed in cluster mode" not in str(e):
                raise AssertionError("db=5 over a cluster: got %r" % str(e))
        expect(r.execute_command("SELECT", 0), True, "SELECT 0 over a cluster")
    else:
        r5 = client(db=5)
        expect(r5.set("py:db", "five"), True, "SET in db 5")
        expect(r5.get("py:db"), b"five", "GET in db 5")
        expect(r.get("py:db"), None, "db 0 sees db 5's key")
        p = r5.pipeline(transaction=True)
        p.incr("py:db:n").incr("py:db:n")
        expect(p.execute(), [1, 2], "MULTI/EXEC in db 5")
        expect(r5.dbsize(), 2, "DBSIZE of db 5")
        expect(r.exists("py:db:n"), 0, "db 0 sees db 5's counter")

    if cluster:
        step("keys in many slots")
        keys = ["py:m:%d" % i for i in range(200)]
        expect(r.mset({k: i for i, k in enumerate(keys)}), True, "MSET over many slots")
        expect(r.mget(keys + ["py:m:missing"]), [str(i).encode() for i in range(200)] + [None],
               "MGET over many slots")
        expect(r.exists(*keys, keys[0]), 201, "EXISTS over many slots")
        expect(r.delete(*keys[:100]), 100, "DEL over many slots")
        expect(r.unlink(*keys), 100, "UNLINK over many slots")
        p = r.pipeline(transaction=True)
        p.set("py:{t}a", 1).incr("py:{t}a").get("py:{t}b")
        expect(p.execute(), [True, 2, None], "MULTI/EXEC on one hash tag")
        p = r.pipeline(transaction=True)
        p.set("py:{t}a", 1).set("py:{u}b", 2)
        try:
            p.execute()
            raise AssertionError("a transaction across slots did not raise")
        except ResponseError as e:
            if "CROSSSLOT" not in str(e):
                raise AssertionError("transaction across slots: got %r" % str(e))
        expect(r.get("py:{t}a"), b"2", "key of the refused transaction")

    step("client name")
    named = client(client_name="pyclient")
    expect(named.client_getname(), "pyclient", "CLIENT GETNAME")
    expect(named.ping(), True, "PING with a name")

    step("client list and kill")
    listed = [c for c in r.client_list() if c["name"] == "pyclient"]
    expect(len(listed), 1, "CLIENT LIST: clients named pyclient")
    expect(listed[0]["id"], str(named.client_id()), "CLIENT LIST id of pyclient")
    expect((listed[0]["flags"], listed[0]["user"]), ("N", "default"), "CLIENT LIST flags, user")
    expect(str(r.client_info()["id"]), str(r.client_id()), "CLIENT INFO id")
    victim = client(client_name="pyvictim")
    vid = victim.client_id()
    expect(r.client_kill_filter(_id=vid), 1, "CLIENT KILL ID")
    try:
        victim.ping()
    except redis.exceptions.ConnectionError:
        pass  # the killed connection; redis-py connects again
    expect(victim.ping(), True, "PING after CLIENT KILL")
    if victim.client_id() == vid:
        raise AssertionError("CLIENT KILL ID left the connection open")
    addr = [c["addr"] for c in r.client_list() if c["name"] == "pyvictim"]
    expect(len(addr), 1, "CLIENT LIST: clients named pyvictim")
    expect(r.client_kill(addr[0]), True, "CLIENT KILL addr:port")
    victim.close()

    step("connection pool")
    pool = redis.ConnectionPool(host="127.0.0.1", port=port, max_connections=4,
                                socket_timeout=10)
    pr = redis.Redis(connection_pool=pool)
    for i in range(200):
        pr.incr("py:pool")
    expect(pr.get("py:pool"), b"200", "INCR through a pool")
    pool.disconnect()

    if acl:
        acl_user(r, client)

    for c in (r, r5, other, sub, named):
        c.close()
    print("OK", flush=True)


def acl_user(admin, client):
    """Logs in as a limited ACL user that admin creates."""
    step("acl user")
    expect(admin.acl_setuser("py-limited", enabled=True, passwords=["+py-pw"],
                             keys=["py:acl:*"], commands=["+get", "+set", "+@connection", "+acl|whoami"]),
           True, "ACL SETUSER")
    limited = client(username="py-limited", password="py-pw")
    expect(limited.acl_whoami(), "py-limited", "ACL WHOAMI")
    expect(limited.set("py:acl:k", "v"), True, "SET of an allowed key")
    expect(limited.get("py:acl:k"), b"v", "GET of an allowed key")
    for what, call, want in (
            ("DEL", lambda: limited.delete("py:acl:k"), "this user has no permissions to run the 'del' command"),
            ("SET of another key", lambda: limited.set("py:other", "v"), "no permissions to access one of the keys"),
    ):
        try:
            call()
            raise AssertionError("%s as a limited user did not raise" % what)
        except NoPermissionError as e:
            if want not in str(e):
                raise AssertionError("%s: got %r, want %r" % (what, str(e), want))
    try:
        client(username="py-limited", password="wrong").ping()
        raise AssertionError("a wrong password did not raise")
    except (AuthenticationError, ResponseError) as e:  # redis-py 4.3 raises the latter for WRONGPASS
        if not str(e).startswith("WRONGPASS invalid username-password pair"):
            raise AssertionError("wrong password: got %r" % str(e))
    limited.close()


if __name__ == "__main__":
    start = time.monotonic()
    main()
    print("took %.2fs" % (time.monotonic() - start), file=sys.stderr)
