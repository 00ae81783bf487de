// Against a running gateway ($GATEWAY_URL, $GATEWAY_TOKEN): typed submit, replay, wait, events.
// Skipped without them; the gateway's test suite runs it against a live server.
import assert from "node:assert/strict";
import { test } from "node:test";

import { GatewayClient, deterministicKey } from "../src/index.js";

const url = process.env.GATEWAY_URL;
const token = process.env.GATEWAY_TOKEN;

test("submit, replay and wait against a live gateway", { skip: !url || !token }, async () => {
  const gateway = new GatewayClient(url!, token!, { backoff: 0.05 });
  const run = process.env.TS_RUN_ID ?? "ts-live";
  const key = deterministicKey("ticket.create", "support", run, "v1");
  const command = {
    type: "ticket.create",
    resource: { type: "queue", id: "support" },
    payload: { title: `from TypeScript ${run}`, priority: "P3" },
    context: { runtime: "typescript", run_id: run },
  } as const;
  const first = await gateway.submit(command, { key });
  const again = await gateway.submit(command, { key });
  assert.equal(again.effect_id, first.effect_id);
  assert.equal(again.replayed, true);
  const done = await gateway.wait(first.effect_id, { timeoutSeconds: 30 });
  assert.equal(done.status, "CONFIRMED");
  const events = await gateway.events(first.effect_id);
  assert.equal(events.at(-1)?.to_status, "CONFIRMED");
  const types = await gateway.effectTypes({ permitted: true });
  assert.ok(types.some((t) => t.type === "ticket.create"));
  console.log(`live: ${first.effect_id} ${done.status} replayed=${again.replayed}`);
});
