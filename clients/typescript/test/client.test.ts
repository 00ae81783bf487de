// The hand-written layer against a scripted HTTP server: retries re-send the same key, 429
// honours Retry-After, wait long-polls until settled, problems become typed errors, keys
// are stable and refuse UUIDs.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import {
  GatewayClient,
  GatewayError,
  IdempotencyKeyMismatch,
  deterministicKey,
  type CommandOf,
} from "../src/index.js";

type Handler = (req: IncomingMessage, body: string) => [number, unknown, Record<string, string>?];
const script: Handler[] = [];
const seen: Array<{ method?: string; url?: string; key?: string; body: string }> = [];
let base = "";
const server = createServer((req: IncomingMessage, res: ServerResponse) => {
  let body = "";
  req.on("data", (chunk) => (body += chunk));
  req.on("end", () => {
    seen.push({ method: req.method, url: req.url, key: req.headers["idempotency-key"] as string, body });
    const handler = script.shift();
    const [status, payload, headers] = handler ? handler(req, body) : [500, { detail: "unscripted" }];
    res.writeHead(status, { "Content-Type": "application/json", ...(headers ?? {}) });
    res.end(JSON.stringify(payload));
  });
});

before(async () => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
after(() => server.close());

const effect = (status: string) => ({ effect_id: "eff_1", type: "ticket.create", status });
const ticket: CommandOf<"ticket.create"> = {
  type: "ticket.create",
  resource: { type: "queue", id: "support" },
  payload: { title: "Printer on fire", priority: "P2" },
};

test("a submission retried after 503 and 429 carries the same key", async () => {
  seen.length = 0;
  script.push(
    () => [503, { detail: "busy" }],
    () => [429, { detail: "slow down" }, { "Retry-After": "0" }],
    () => [200, effect("PREPARED"), { "Idempotent-Replayed": "true" }],
  );
  const client = new GatewayClient(base, "egw_test", { backoff: 0.01 });
  const key = deterministicKey("ticket.create", "support", "printer", "v1");
  const submitted = await client.submit(ticket, { key });
  assert.equal(submitted.replayed, true);
  assert.deepEqual(
    seen.map((s) => s.key),
    [key, key, key],
  );
  assert.deepEqual(JSON.parse(seen[0].body), ticket);
});

test("wait long-polls until the effect is settled", async () => {
  seen.length = 0;
  script.push(
    () => [200, effect("AWAITING_APPROVAL")],
    () => [200, effect("DISPATCHING")],
    () => [200, effect("CONFIRMED")],
  );
  const client = new GatewayClient(base, "egw_test");
  const done = await client.wait("eff_1", { timeoutSeconds: 5 });
  assert.equal(done.status, "CONFIRMED");
  assert.match(seen[1].url ?? "", /\?wait=\d/);
  // Each poll names the status the client saw, so an effect that moved on answers at once,
  // and what it waits for (settled), so that the gateway answers past the statuses between.
  const settled = "CANCELLED%2CCOMPENSATED%2CCOMPENSATION_FAILED%2CCONFIRMED%2CEXPIRED%2CREJECTED";
  assert.match(seen[1].url ?? "", new RegExp(`&seen=AWAITING_APPROVAL&until=${settled}$`));
  assert.match(seen[2].url ?? "", new RegExp(`&seen=DISPATCHING&until=${settled}$`));
});

test("wait from the submitted effect starts with a long poll, not a look", async () => {
  seen.length = 0;
  script.push(() => [200, effect("CONFIRMED")]);
  const client = new GatewayClient(base, "egw_test");
  const done = await client.wait(effect("PREPARED") as never, { timeoutSeconds: 5 });
  assert.equal(done.status, "CONFIRMED");
  assert.equal(seen.length, 1);
  assert.match(seen[0].url ?? "", /\?wait=\d.*&seen=PREPARED&until=/);
});

test("problems become typed errors with the problem document", async () => {
  script.push(() => [
    422,
    { type: "https://effect-gateway.dev/problems/idempotency-key-mismatch", detail: "other digest" },
  ]);
  const client = new GatewayClient(base, "egw_test");
  await assert.rejects(client.submit(ticket, { key: "k:1" }), (error: unknown) => {
    assert.ok(error instanceof IdempotencyKeyMismatch);
    assert.equal((error as GatewayError).slug, "idempotency-key-mismatch");
    return true;
  });
  script.push(() => [404, { type: "https://effect-gateway.dev/problems/not-found", detail: "No effect" }]);
  await assert.rejects(client.get("eff_x"), (error: unknown) => (error as GatewayError).status === 404);
});

test("keys are stable, normalised and never UUIDs", () => {
  assert.equal(
    deterministicKey("billing.refund.create", "ord 881", "incident_120", "v1"),
    "billing.refund.create:ord-881:incident_120:v1",
  );
  assert.throws(() => deterministicKey("t", "6f1c2d3e-1111-4222-8333-944445555666"), /UUID/);
  assert.throws(() => deterministicKey("only-one"));
  const long = deterministicKey("t", "x".repeat(400));
  assert.equal(long.length, 255);
  assert.equal(long, deterministicKey("t", "x".repeat(400)));
});

// Compile-time checks (tsc fails the test run if the types stop discriminating by `type`).
export function typedPayloads(client: GatewayClient) {
  // @ts-expect-error a ticket has no amount, and title/priority are required
  void client.submit({ type: "ticket.create", resource: { type: "queue", id: "s" }, payload: { amount: 5 } }, { key: "k:1" });
  // @ts-expect-error a refund's resource is an order, not a queue
  void client.submit({ type: "billing.refund.create", resource: { type: "queue", id: "s" }, payload: { amount: 500, currency: "EUR", reason: "dup" } }, { key: "k:2" });
  // @ts-expect-error unknown effect type
  void client.submit({ type: "billing.refund.maybe", resource: { type: "order", id: "o" }, payload: {} }, { key: "k:3" });
}
