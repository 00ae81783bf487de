/**
 * The Effect Gateway's TypeScript client.
 *
 * The types come from the gateway's OpenAPI schema (`src/schema.d.ts`, generated from
 * `/api/schema/` by `npm run generate`): a command is a union discriminated by `type`, so
 * `submit({type: "billing.refund.create", payload: {...}})` is checked against the refund
 * contract's payload schema. This file is the small hand-written layer: stable idempotency
 * keys, retries that re-send the *same* key, and `wait` (the gateway's long poll).
 */

import { createHash } from "node:crypto";

import type { components } from "./schema.js";

export type Schemas = components["schemas"];
/** Every command the gateway accepts: one variant per effect type. */
export type Command = Schemas["CommandSubmitRequest"];
export type EffectTypeName = Command["type"];
/** The command of one effect type, e.g. `CommandOf<"ticket.create">`. */
export type CommandOf<T extends EffectTypeName> = Extract<Command, { type: T }>;
export type PayloadOf<T extends EffectTypeName> = CommandOf<T>["payload"];
export type Effect = Schemas["Effect"];
export type EffectStatus = Effect["status"];
export type EffectEvent = Schemas["EffectEvent"];
export type EffectType = Schemas["EffectType"];
export type Problem = Schemas["Problem"];

/** Waiting longer changes nothing without a human or a new command. */
export const SETTLED: ReadonlySet<string> = new Set([
  "CONFIRMED",
  "REJECTED",
  "EXPIRED",
  "CANCELLED",
  "COMPENSATED",
  "COMPENSATION_FAILED",
]);

const RETRY_STATUSES = new Set([429, 502, 503, 504]);
const MAX_POLL_SECONDS = 30;
const MAX_KEY_LENGTH = 255;
const UNSAFE = /[^A-Za-z0-9._~@+=/-]+/g;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** Any answer of the gateway that is not a success; `problem` is its RFC 9457 document. */
export class GatewayError extends Error {
  readonly status: number | undefined;
  readonly problem: Partial<Problem> & Record<string, unknown>;

  constructor(message: string, status?: number, problem: Record<string, unknown> = {}) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.problem = problem;
  }

  /** The problem type's slug: `validation-error`, `idempotency-key-mismatch`, … */
  get slug(): string {
    return String(this.problem.type ?? "").split("/").pop() ?? "";
  }
}

/** 422: the key already names another command. Same payload replays; a new plan needs a new key. */
export class IdempotencyKeyMismatch extends GatewayError {}
/** The gateway could not be reached, or kept failing. Submitting again with the same key is safe. */
export class GatewayUnavailable extends GatewayError {}

/**
 * Join business values into a stable idempotency key:
 * `deterministicKey("billing.refund.create", "ord_881", "incident_120", "v1")`.
 * A retry, a re-run or a second worker computes the same key, so the gateway answers with the
 * effect it already has. UUIDs are refused: a key per attempt makes every retry a new command.
 */
export function deterministicKey(...parts: Array<string | number>): string {
  if (parts.length < 2) {
    throw new Error("a key needs at least the effect type and the business resource");
  }
  const cleaned = parts.map((part) => {
    const text = String(part).trim();
    if (UUID.test(text)) {
      throw new Error("a UUID is not a business key part; derive the key from the plan");
    }
    const normalised = text.replace(UNSAFE, "-").replace(/^-+|-+$/g, "");
    if (!normalised) throw new Error(`key part ${JSON.stringify(part)} is empty once normalised`);
    return normalised;
  });
  const key = cleaned.join(":");
  if (key.length <= MAX_KEY_LENGTH) return key;
  const digest = createHash("sha256").update(key).digest("hex").slice(0, 32);
  return `${key.slice(0, MAX_KEY_LENGTH - 33)}~${digest}`;
}

export interface ClientOptions {
  /** Attempts after the first, for what is safe to retry. Default 4. */
  retries?: number;
  /** First backoff in seconds (doubling, jittered). Default 0.5. */
  backoff?: number;
  maxBackoff?: number;
  /** Per-request timeout in milliseconds (a long poll adds its own wait). Default 10000. */
  timeoutMs?: number;
  fetch?: typeof fetch;
  userAgent?: string;
}

export type SubmittedEffect = Effect & {
  /** True when the key already named this effect: nothing new was recorded or sent. */
  replayed: boolean;
};

interface RequestOptions {
  body?: unknown;
  headers?: Record<string, string>;
  /** May be re-sent after a dropped connection (GETs, submissions: the key makes them safe). */
  idempotent?: boolean;
  timeoutMs?: number;
}

export class GatewayClient {
  readonly baseUrl: string;
  private readonly token: string;
  private readonly retries: number;
  private readonly backoff: number;
  private readonly maxBackoff: number;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;
  private readonly userAgent: string;

  constructor(baseUrl: string, token: string, options: ClientOptions = {}) {
    if (!token) throw new Error("a gateway token is required");
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.token = token;
    this.retries = options.retries ?? 4;
    this.backoff = options.backoff ?? 0.5;
    this.maxBackoff = options.maxBackoff ?? 10;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.fetchImpl = options.fetch ?? globalThis.fetch;
    this.userAgent = options.userAgent ?? "effect-gateway-client-ts/0.2";
  }

  /** Submit a command under `key`; the same key and payload always give one effect. */
  async submit<T extends EffectTypeName>(
    command: CommandOf<T>,
    options: { key: string },
  ): Promise<SubmittedEffect> {
    if (!options.key) throw new Error("key is required: use deterministicKey(...) from the plan");
    const response = await this.request("POST", "/api/v1/commands", {
      body: command,
      headers: { "Idempotency-Key": options.key },
      idempotent: true,
    });
    const effect = (await response.json()) as Effect;
    return { ...effect, replayed: response.headers.get("Idempotent-Replayed") === "true" };
  }

  async get(effectId: string): Promise<Effect> {
    return (await this.request("GET", `/api/v1/effects/${encodeURIComponent(effectId)}`)).json();
  }

  /**
   * Follow an effect with the long poll until its status is in `until` (default: settled).
   * Pass the effect `submit` answered to start from its status (one request fewer); an id is
   * read first.
   */
  async wait(
    effectOrId: Effect | string,
    options: { timeoutSeconds: number; until?: Iterable<string> },
  ): Promise<Effect> {
    const targets = new Set(options.until ?? SETTLED);
    const untilParam = [...targets].sort().join(",");
    const deadline = Date.now() + Math.max(options.timeoutSeconds, 0) * 1000;
    const effectId = typeof effectOrId === "string" ? effectOrId : effectOrId.effect_id;
    let effect = typeof effectOrId === "string" ? await this.get(effectId) : effectOrId;
    while (!targets.has(effect.status)) {
      const remaining = (deadline - Date.now()) / 1000;
      if (remaining <= 0) break;
      const poll = Math.min(remaining, MAX_POLL_SECONDS);
      // `until`: the poll answers once the effect is in one of them, past any status between;
      // `seen`: the status this client saw, for a gateway without `until` (answers if moved on).
      const query =
        `wait=${poll.toFixed(2)}&seen=${encodeURIComponent(effect.status)}` +
        `&until=${encodeURIComponent(untilParam)}`;
      const path = `/api/v1/effects/${encodeURIComponent(effectId)}?${query}`;
      const response = await this.request("GET", path, { timeoutMs: poll * 1000 + this.timeoutMs });
      effect = (await response.json()) as Effect;
    }
    return effect;
  }

  async list(
    filters: { status?: string[]; type?: EffectTypeName; runId?: string; limit?: number } = {},
  ): Promise<Schemas["PaginatedEffectList"]> {
    const query = new URLSearchParams();
    if (filters.status?.length) query.set("status", filters.status.join(","));
    if (filters.type) query.set("type", filters.type);
    if (filters.runId) query.set("context.run_id", filters.runId);
    if (filters.limit) query.set("limit", String(filters.limit));
    const suffix = query.toString() ? `?${query}` : "";
    return (await this.request("GET", `/api/v1/effects${suffix}`)).json();
  }

  async events(effectId: string): Promise<EffectEvent[]> {
    const path = `/api/v1/effects/${encodeURIComponent(effectId)}/events`;
    return (await this.request("GET", path)).json();
  }

  async effectTypes(options: { permitted?: boolean } = {}): Promise<EffectType[]> {
    const path = `/api/v1/effect-types${options.permitted ? "?permitted=true" : ""}`;
    const body = (await (await this.request("GET", path)).json()) as { results: EffectType[] };
    return body.results;
  }

  async approve(effectId: string, payloadDigest: string, comment = ""): Promise<Effect> {
    return this.action(effectId, "approve", { payload_digest: payloadDigest, comment });
  }

  async reject(effectId: string, reason = ""): Promise<Effect> {
    return this.action(effectId, "reject", { reason });
  }

  async cancel(effectId: string, reason = ""): Promise<Effect> {
    return this.action(effectId, "cancel", { reason });
  }

  private async action(effectId: string, verb: string, body: unknown): Promise<Effect> {
    const path = `/api/v1/effects/${encodeURIComponent(effectId)}/${verb}`;
    return (await this.request("POST", path, { body })).json();
  }

  /**
   * One request, retried when that is safe: a connection refused (nothing arrived) always;
   * 429/502/503/504 (honouring Retry-After); a dropped connection or a timeout only for
   * idempotent requests — a submission is re-sent with the same Idempotency-Key, so the
   * gateway replays it rather than recording a second command.
   */
  private async request(method: string, path: string, options: RequestOptions = {}) {
    const idempotent = options.idempotent ?? method === "GET";
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.token}`,
      Accept: "application/json",
      "User-Agent": this.userAgent,
      ...options.headers,
    };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    for (let attempt = 1; ; attempt++) {
      let response: Response;
      try {
        response = await this.fetchImpl(this.baseUrl + path, {
          method,
          headers,
          body: options.body === undefined ? undefined : JSON.stringify(options.body),
          signal: AbortSignal.timeout(options.timeoutMs ?? this.timeoutMs),
          redirect: "manual",
        });
      } catch (error) {
        const refused = connectionRefused(error);
        if ((refused || idempotent) && attempt <= this.retries) {
          await this.sleep(attempt);
          continue;
        }
        throw new GatewayUnavailable(
          `the gateway at ${this.baseUrl} did not answer: ${String(error)}`,
        );
      }
      if (response.status < 400) return response;
      const retryAfter = Number(response.headers.get("Retry-After"));
      if (RETRY_STATUSES.has(response.status) && attempt <= this.retries) {
        await this.sleep(attempt, Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : null);
        continue;
      }
      throw await problemOf(response);
    }
  }

  private sleep(attempt: number, retryAfter: number | null = null): Promise<void> {
    const ceiling = Math.min(this.maxBackoff, this.backoff * 2 ** (attempt - 1));
    const seconds =
      retryAfter !== null
        ? Math.min(retryAfter, this.maxBackoff * 3)
        : ceiling / 2 + (Math.random() * ceiling) / 2;
    return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  }
}

function connectionRefused(error: unknown): boolean {
  const cause = (error as { cause?: { code?: string } })?.cause;
  return cause?.code === "ECONNREFUSED";
}

async function problemOf(response: Response): Promise<GatewayError> {
  let problem: Record<string, unknown> = {};
  try {
    problem = (await response.json()) as Record<string, unknown>;
  } catch {
    problem = { status: response.status };
  }
  const detail = String(problem.detail ?? problem.title ?? `HTTP ${response.status}`);
  const slug = String(problem.type ?? "").split("/").pop();
  if (slug === "idempotency-key-mismatch" || response.status === 422) {
    return new IdempotencyKeyMismatch(detail, response.status, problem);
  }
  if (response.status >= 500) return new GatewayUnavailable(detail, response.status, problem);
  return new GatewayError(detail, response.status, problem);
}
