// A node-redis (@redis/client) session in RESP3 through hotkeyproxy, run
// by e2e/resp3_clients_test.go.
//
// Usage: node node_redis_session.js PORT HOTKEY
//
// Connects with RESP: 3 (HELLO 3 at connect), as an application that
// wants RESP3 would, and checks what RESP3 changes: maps (HGETALL, CONFIG
// GET, HELLO, the proxy's PROXY HOTKEYS), doubles (ZSCORE, ZINCRBY), sets,
// nulls, a hot key held as buckets, MULTI/EXEC, pub/sub with commands on
// the subscribed connection, and server errors. Prints each step, then
// OK; any mismatch exits non-zero.
"use strict";

const assert = require("node:assert/strict");
const { createClient } = require("@redis/client");

const port = Number(process.argv[2]);
const hotKey = process.argv[3];
if (!Number.isInteger(port) || port <= 0 || !hotKey || process.argv.length > 4) {
  console.error("usage: node node_redis_session.js PORT HOTKEY");
  process.exit(2);
}

// A hung proxy must not hang the test: give up after 60 s.
setTimeout(() => {
  console.error("node_redis_session.js: timed out");
  process.exit(1);
}, 60000).unref();

function step(name) {
  console.log("step:", name);
}

async function main() {
  const opts = { socket: { host: "127.0.0.1", port, reconnectStrategy: false }, RESP: 3 };
  const client = createClient(opts);
  client.on("error", (err) => console.error("client error:", err));
  await client.connect();

  step("hello");
  const hello = await client.sendCommand(["HELLO", "3"]);
  assert.equal(hello.proto, 3);
  assert.equal(hello.mode, "standalone");
  assert.equal(hello.id, await client.clientId());

  step("strings and nulls");
  assert.equal(await client.set("nr:s", "v"), "OK");
  assert.equal(await client.get("nr:s"), "v");
  assert.equal(await client.get("nr:missing"), null);
  assert.equal(await client.hGet("nr:h", "f"), null);

  step("maps");
  await client.hSet("nr:h", { a: "1", b: "2" });
  assert.deepEqual({ ...(await client.hGetAll("nr:h")) }, { a: "1", b: "2" });
  const cfg = await client.configGet("maxmemory-policy");
  assert.deepEqual({ ...cfg }, { "maxmemory-policy": "noeviction" });

  step("doubles and sets");
  await client.zAdd("nr:z", { score: 1.5, value: "m" });
  assert.equal(await client.zScore("nr:z", "m"), 1.5);
  assert.equal(await client.zIncrBy("nr:z", 0.25, "m"), 1.75);
  await client.sAdd("nr:set", ["x", "y"]);
  assert.deepEqual([...(await client.sMembers("nr:set"))].sort(), ["x", "y"]);

  step("hot key");
  assert.equal(await client.get(hotKey), null);
  assert.equal(await client.set(hotKey, "100"), "OK");
  assert.equal(await client.decrBy(hotKey, 7), 93);
  assert.equal(await client.get(hotKey), "93");
  assert.deepEqual(await client.mGet([hotKey, "nr:missing"]), ["93", null]);
  const report = await client.sendCommand(["PROXY", "HOTKEYS"]);
  assert.equal(report.length, 1);
  assert.equal(report[0].key, hotKey);
  assert.equal(report[0].sum, "93");

  step("multi");
  // One hash tag: in front of a cluster a transaction is on one slot.
  const replies = await client.multi().set("{nr}t", "1").incr("{nr}t").hSet("{nr}h", "a", "1").hGetAll("{nr}h").exec();
  assert.equal(replies[0], "OK");
  assert.equal(replies[1], 2);
  assert.equal(replies[2], 1);
  assert.deepEqual({ ...replies[3] }, { a: "1" });

  step("errors");
  await assert.rejects(client.hGetAll("nr:s"), /WRONGTYPE/);
  await assert.rejects(client.sendCommand(["NOPE"]), /unknown command/);

  step("pubsub");
  const sub = client.duplicate();
  sub.on("error", (err) => console.error("subscriber error:", err));
  await sub.connect();
  const got = new Promise((resolve) => sub.subscribe("nr:ch", (message, channel) => resolve([channel, message])));
  // RESP3: the subscribed connection keeps running commands.
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(await sub.get("nr:s"), "v");
  assert.equal(await client.publish("nr:ch", "hello"), 1);
  assert.deepEqual(await got, ["nr:ch", "hello"]);
  await sub.unsubscribe("nr:ch");
  assert.equal(await sub.ping(), "PONG");
  sub.destroy();

  client.destroy();
  console.log("OK");
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
