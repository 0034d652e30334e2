// An ioredis session through hotkeyproxy, run by e2e/clients_test.go.
//
// Usage: node session.js PORT [cluster] [acl] [resp3]
//
// Uses ioredis as an application would: PING, strings, binary values,
// pipelines, MULTI/EXEC with WATCH, defineCommand (EVAL on a connection's
// first call, then EVALSHA, back to EVAL on NOSCRIPT), SCRIPT LOAD +
// EVALSHA, pub/sub across two connections, SELECT through the db option and
// the command, auto-pipelining, and server errors as ReplyError. Prints each
// step, then OK; any mismatch exits non-zero.
//
// With "cluster" the proxy's upstream is a Redis Cluster: SELECT n gets
// Redis Cluster's error instead, and keys in many slots and transactions on
// one hash tag or across slots are tried too.
//
// With "acl" Redis checks the proxy's logins (upstream.client_auth: redis):
// the session creates a limited ACL user and logs in as it with the
// username option, then checks Redis's NOPERM and WRONGPASS errors.
//
// With "resp3" every connection speaks RESP3 (protocol: 3, HELLO 3), where
// pub/sub arrives as push frames beside command replies; without it, RESP2.
// Both run a tracking step: a connection tracks with REDIRECT to a RESP2
// one that subscribes to __redis__:invalidate, as ioredis applications do.
"use strict";

const assert = require("node:assert/strict");
const Redis = require("ioredis");
const { ReplyError } = require("ioredis");

const port = Number(process.argv[2]);
const opts = process.argv.slice(3);
const cluster = opts.includes("cluster");
const acl = opts.includes("acl");
const resp3 = opts.includes("resp3");
if (!Number.isInteger(port) || port <= 0 || new Set(opts).size !== opts.length || opts.some((o) => !["cluster", "acl", "resp3"].includes(o))) {
  console.error("usage: node session.js PORT [cluster] [acl] [resp3]");
  process.exit(2);
}

// A hung proxy must not hang the test: give up after 60 s.
setTimeout(() => {
  console.error("session.js: timed out");
  process.exit(3);
}, 60_000).unref();

const clients = [];

function client(opts = {}) {
  const c = new Redis({
    host: "127.0.0.1",
    port,
    connectTimeout: 5000,
    commandTimeout: 10_000,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null, // no reconnects: a dropped connection is a failure
    protocol: resp3 ? 3 : 2,
    ...opts,
  });
  c.on("error", (err) => {
    console.error("connection error event:", err);
    process.exitCode = 1;
  });
  clients.push(c);
  return c;
}

function step(name) {
  console.log("step:", name);
}

function isReplyError(prefix) {
  return (err) => {
    assert.ok(err instanceof ReplyError, `want ReplyError, got ${err && err.constructor.name}: ${err}`);
    assert.ok(err.message.startsWith(prefix), `want an error starting with ${prefix}, got ${err.message}`);
    return true;
  };
}

// waitFor resolves with the first emitted event's arguments, or rejects
// after ms.
function waitFor(emitter, event, ms = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      emitter.removeListener(event, on);
      reject(new Error(`no ${event} event within ${ms} ms`));
    }, ms);
    function on(...args) {
      clearTimeout(timer);
      resolve(args);
    }
    emitter.once(event, on);
  });
}

async function main() {
  console.log("ioredis", require("ioredis/package.json").version, resp3 ? "RESP3" : "RESP2");
  const r = client();

  step("ping");
  assert.equal(await r.ping(), "PONG");
  assert.equal(await r.echo("hello"), "hello");

  step("set/get");
  assert.equal(await r.set("js:str", "value"), "OK");
  assert.equal(await r.get("js:str"), "value");
  assert.equal(await r.set("js:str", "other", "NX"), null);
  assert.equal(await r.set("js:ttl", "v", "EX", 100), "OK");
  const ttl = await r.ttl("js:ttl");
  assert.ok(ttl > 0 && ttl <= 100, `TTL ${ttl}`);
  assert.equal(await r.incrby("js:counter", 5), 5);
  assert.equal(await r.get("js:missing"), null);
  assert.equal(await r.del("js:str", "js:missing"), 1);

  step("binary values");
  const blob = Buffer.concat([
    Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
    Buffer.from("\r\n$3\r\n*1\r\n\0", "latin1"),
  ]);
  const binKey = Buffer.from([0x6a, 0x73, 0x00, 0xff, 0x0d, 0x0a]);
  assert.equal(await r.set(binKey, blob), "OK");
  assert.deepEqual(await r.getBuffer(binKey), blob);
  assert.equal(await r.strlen(binKey), blob.length);
  const big = Buffer.alloc(1 << 20, 0);
  for (let i = 0; i < big.length; i++) big[i] = i % 251;
  assert.equal(await r.set("js:big", big), "OK");
  assert.deepEqual(await r.getBuffer("js:big"), big);

  step("hash/list/set");
  assert.equal(await r.hset("js:h", { a: "1", b: "2" }), 2);
  assert.deepEqual(await r.hgetall("js:h"), { a: "1", b: "2" });
  assert.equal(await r.rpush("js:l", "x", "y", "z"), 3);
  assert.deepEqual(await r.lrange("js:l", 0, -1), ["x", "y", "z"]);
  assert.equal(await r.sadd("js:s", "m1", "m2", "m1"), 2);
  assert.deepEqual((await r.smembers("js:s")).sort(), ["m1", "m2"]);

  step("pipeline");
  let p = r.pipeline();
  for (let i = 0; i < 100; i++) p.set(`js:p:${i}`, i);
  for (let i = 0; i < 100; i++) p.get(`js:p:${i}`);
  p.incr("js:p:counter");
  p.lpush("js:p:0", "x"); // WRONGTYPE, reported in place
  let res = await p.exec();
  assert.equal(res.length, 202);
  for (let i = 0; i < 100; i++) assert.deepEqual(res[i], [null, "OK"], `pipeline SET ${i}`);
  for (let i = 0; i < 100; i++) assert.deepEqual(res[100 + i], [null, String(i)], `pipeline GET ${i}`);
  assert.deepEqual(res[200], [null, 1]);
  isReplyError("WRONGTYPE")(res[201][0]);

  step("multi/exec");
  res = await r.multi().set("js:tx:a", "1").incr("js:tx:a").get("js:tx:a").exec();
  assert.deepEqual(res, [[null, "OK"], [null, 2], [null, "2"]]);
  res = await r.multi().set("js:tx:b", "str").lpush("js:tx:b", "x").get("js:tx:b").exec();
  assert.deepEqual(res[0], [null, "OK"]);
  isReplyError("WRONGTYPE")(res[1][0]);
  assert.deepEqual(res[2], [null, "str"]);
  // A command Redis refuses while queueing aborts the transaction.
  await assert.rejects(r.multi().set("js:tx:c", "1").call("nosuchcommand").exec(), isReplyError("EXECABORT"));
  assert.equal(await r.exists("js:tx:c"), 0);

  step("watch");
  const other = client();
  await r.set("js:w", "10");
  assert.equal(await r.watch("js:w"), "OK");
  assert.equal(await r.get("js:w"), "10");
  await other.set("js:w", "changed");
  assert.equal(await r.multi().set("js:w", "mine").exec(), null, "EXEC after the watched key changed");
  assert.equal(await r.get("js:w"), "changed");
  assert.equal(await r.watch("js:w"), "OK");
  assert.deepEqual(await r.multi().set("js:w", "mine").exec(), [[null, "OK"]]);
  assert.equal(await r.get("js:w"), "mine");
  assert.equal(await r.watch("js:w"), "OK");
  assert.equal(await r.unwatch(), "OK");
  await other.set("js:w", "again");
  assert.deepEqual(await r.multi().set("js:w", "after-unwatch").exec(), [[null, "OK"]]);

  step("scripts");
  r.defineCommand("addBy", {
    numberOfKeys: 1,
    lua: "return redis.call('INCRBY', KEYS[1], ARGV[1]) + 0",
  });
  assert.equal(await r.addBy("js:sc", 3), 3); // EVAL: first use on this connection
  assert.equal(await r.addBy("js:sc", 4), 7); // EVALSHA
  assert.equal(await r.script("FLUSH"), "OK");
  assert.equal(await r.addBy("js:sc", 1), 8); // EVALSHA -> NOSCRIPT -> EVAL
  assert.equal(await r.addBy("js:sc", 2), 10); // EVALSHA again
  res = await r.pipeline().addBy("js:sc", 1).get("js:sc").exec();
  assert.deepEqual(res, [[null, 11], [null, "11"]]);
  res = await r.multi().addBy("js:sc", 1).get("js:sc").exec();
  assert.deepEqual(res, [[null, 12], [null, "12"]]);
  const sha = await r.script("LOAD", "return {KEYS[1], ARGV[1]}");
  assert.match(sha, /^[0-9a-f]{40}$/);
  assert.deepEqual(await r.script("EXISTS", sha), [1]);
  assert.deepEqual(await r.evalsha(sha, 1, "k", "a"), ["k", "a"]);
  await assert.rejects(r.evalsha("0".repeat(40), 0), isReplyError("NOSCRIPT"));
  await r.set("js:str:2", "s");
  await assert.rejects(r.eval("return redis.call('LPUSH', KEYS[1], 'x')", 1, "js:str:2"), isReplyError("WRONGTYPE"));

  step("errors");
  await r.set("js:e", "string");
  await assert.rejects(r.lpush("js:e", "x"), isReplyError("WRONGTYPE"));
  await assert.rejects(r.call("nosuchcommand", "x"), isReplyError("ERR unknown command"));
  assert.equal(await r.ping(), "PONG");

  step("pub/sub");
  const sub = client();
  const pub = client();
  assert.equal(await sub.subscribe("js:chan"), 1);
  assert.equal(await sub.psubscribe("js:pat:*"), 2);
  let got = waitFor(sub, "messageBuffer");
  const payload = Buffer.from([0x68, 0x69, 0x00, 0xff, 0x0d, 0x0a]);
  assert.equal(await pub.publish("js:chan", payload), 1);
  let [channel, message] = await got;
  assert.equal(channel.toString(), "js:chan");
  assert.deepEqual(message, payload);
  got = waitFor(sub, "pmessage");
  assert.equal(await pub.publish("js:pat:x", "p"), 1);
  let [pattern, pchannel, pmessage] = await got;
  assert.deepEqual([pattern, pchannel, pmessage], ["js:pat:*", "js:pat:x", "p"]);
  // Redis 7.0 answers PING while subscribed as a pub/sub frame in RESP2 and
  // as a plain reply in RESP3.
  assert.deepEqual(await sub.ping(), resp3 ? "PONG" : ["pong", ""]);
  assert.equal(await sub.unsubscribe("js:chan"), 1);
  assert.equal(await sub.punsubscribe(), 0);
  assert.equal(await pub.publish("js:chan", "nobody"), 0);

  step("select");
  if (cluster) {
    const sel = client();
    // ioredis also reports a refused SELECT as a connection error event.
    sel.removeAllListeners("error");
    sel.on("error", (err) => {
      if (!/SELECT is not allowed in cluster mode/.test(err.message)) {
        console.error("connection error event:", err);
        process.exitCode = 1;
      }
    });
    await assert.rejects(sel.select(6), isReplyError("ERR SELECT is not allowed in cluster mode"));
    assert.equal(await sel.select(0), "OK");
    assert.equal(await sel.get("js:db"), null);

    step("keys in many slots");
    const keys = Array.from({ length: 200 }, (_, i) => `js:m:${i}`);
    assert.equal(await r.mset(Object.fromEntries(keys.map((k, i) => [k, String(i)]))), "OK");
    assert.deepEqual(await r.mget([...keys, "js:m:missing"]), [...keys.map((_, i) => String(i)), null]);
    assert.equal(await r.exists([...keys, keys[0]]), 201);
    assert.equal(await r.del(keys.slice(0, 100)), 100);
    assert.equal(await r.unlink(keys), 100);
    res = await r.multi().set("js:{t}a", "1").incr("js:{t}a").get("js:{t}b").exec();
    assert.deepEqual(res, [[null, "OK"], [null, 2], [null, null]]);
    await assert.rejects(r.multi().set("js:{t}a", "1").set("js:{u}b", "2").exec(), isReplyError("EXECABORT"));
    assert.equal(await r.get("js:{t}a"), "2");
  } else {
    const r4 = client({ db: 4 });
    assert.equal(await r4.set("js:db", "four"), "OK");
    assert.equal(await r4.get("js:db"), "four");
    assert.equal(await r.get("js:db"), null);
    res = await r4.multi().incr("js:db:n").incr("js:db:n").exec();
    assert.deepEqual(res, [[null, 1], [null, 2]]);
    assert.equal(await r4.dbsize(), 2);
    const sel = client();
    assert.equal(await sel.select(6), "OK");
    assert.equal(await sel.set("js:db6", "six"), "OK");
    assert.equal(await sel.select(4), "OK");
    assert.equal(await sel.get("js:db"), "four");
    assert.equal(await sel.get("js:db6"), null);
  }

  step("client name");
  const named = client({ connectionName: "ioclient" });
  assert.equal(await named.client("GETNAME"), "ioclient");

  step("client list and kill");
  const namedID = await named.client("ID");
  const line = (await r.client("LIST")).split("\n").find((l) => l.includes(" name=ioclient "));
  assert.ok(line && line.startsWith(`id=${namedID} addr=`), `CLIENT LIST line of ioclient: ${line}`);
  assert.match(await r.client("INFO"), new RegExp(`^id=${await r.client("ID")} `));
  for (const how of ["ID", "ADDR"]) {
    const victim = client({ connectionName: "iovictim" });
    const info = await victim.client("INFO");
    const closed = new Promise((resolve) => victim.once("end", resolve));
    if (how === "ID") {
      assert.equal(await r.client("KILL", "ID", await victim.client("ID")), 1);
    } else {
      assert.equal(await r.client("KILL", info.match(/ addr=(\S+) /)[1]), "OK");
    }
    await closed; // without reconnects, the kill ends the connection
    clients.splice(clients.indexOf(victim), 1);
  }

  step("tracking");
  await tracking(r);

  step("auto-pipelining and concurrency");
  const auto = client({ enableAutoPipelining: true });
  await Promise.all(Array.from({ length: 1000 }, (_, i) => auto.incr(`js:auto:${i % 10}`)));
  const vals = await auto.mget(Array.from({ length: 10 }, (_, i) => `js:auto:${i}`));
  assert.deepEqual(vals, Array(10).fill("100"));
  const gets = await Promise.all(Array.from({ length: 100 }, (_, i) => auto.get(`js:p:${i}`)));
  assert.deepEqual(gets, Array.from({ length: 100 }, (_, i) => String(i)));

  if (acl) await aclUser(r);

  for (const c of clients) assert.equal(await c.quit(), "OK");
  console.log("OK");
}

// tracking has a connection read a key with CLIENT TRACKING ON REDIRECT to
// a subscriber of __redis__:invalidate, has writer change the key, and
// waits for the invalidation message that names it. In cluster mode the
// proxy refuses tracking (a client's keys live on every master).
async function tracking(writer) {
  // ioredis drops RESP3 invalidate pushes, and Redis sends one to a RESP3
  // redirect target: the subscriber speaks RESP2 in both sessions.
  const inv = client({ protocol: 2 });
  const reader = client();
  if (cluster) {
    await assert.rejects(reader.client("TRACKING", "ON"), isReplyError("ERR CLIENT TRACKING is not supported by hotkeyproxy in cluster mode"));
    return;
  }
  const invID = await inv.client("ID");
  assert.equal(await inv.subscribe("__redis__:invalidate"), 1);
  assert.equal(await reader.client("TRACKING", "ON", "REDIRECT", invID), "OK");
  assert.equal(await reader.client("GETREDIR"), invID);
  await writer.set("js:track", "v1");
  assert.equal(await reader.get("js:track"), "v1");
  const got = waitFor(inv, "message");
  await writer.set("js:track", "v2");
  const [channel, keys] = await got;
  assert.equal(channel, "__redis__:invalidate");
  assert.equal(String(keys), "js:track"); // an array of keys, as Redis sends it
  assert.equal(await reader.client("TRACKING", "OFF"), "OK");
}

// aclUser logs in as a limited ACL user that admin creates.
async function aclUser(admin) {
  step("acl user");
  assert.equal(await admin.acl("SETUSER", "js-limited", "on", ">js-pw", "~js:acl:*", "+get", "+set", "+@connection", "+acl|whoami"), "OK");
  const limited = client({ username: "js-limited", password: "js-pw" });
  assert.equal(await limited.acl("WHOAMI"), "js-limited");
  assert.equal(await limited.set("js:acl:k", "v"), "OK");
  assert.equal(await limited.get("js:acl:k"), "v");
  await assert.rejects(limited.del("js:acl:k"), (err) => err instanceof ReplyError &&
    err.message === "NOPERM this user has no permissions to run the 'del' command");
  await assert.rejects(limited.set("js:other", "v"), (err) => err instanceof ReplyError &&
    err.message === "NOPERM this user has no permissions to access one of the keys used as arguments");
  const wrong = new Redis({ host: "127.0.0.1", port, protocol: resp3 ? 3 : 2, username: "js-limited", password: "wrong", lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  const refused = [];
  wrong.on("error", (err) => refused.push(err.message)); // the refused login is the point
  await wrong.connect().catch(() => {});
  wrong.disconnect();
  assert.ok(refused.some((m) => m.startsWith("WRONGPASS invalid username-password pair")), `errors of a wrong password: ${refused}`);
}

main().catch((err) => {
  console.error("FAIL:", err);
  process.exit(1);
});
