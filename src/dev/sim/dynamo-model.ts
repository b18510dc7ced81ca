import { type Channel, machineOf, Network } from "./network.ts";
import type { Scheduler } from "./scheduler.ts";

/**
 * A model of one DynamoDB table at the level the DocumentClient speaks (plain JS values, string
 * sets as `Set`), for the REAL coordination-store adapter (src/adapters/dynamo-coordination-store.ts)
 * to run against: PutItem, GetItem, UpdateItem, Query (table and GSI, strongly consistent) and
 * TransactWriteItems (Put, Update, Delete, ConditionCheck; all or nothing, with cancellation
 * reasons), with condition and update expressions evaluated as DynamoDB does for the subset the
 * adapter uses (comparisons, AND/OR/NOT, IN, attribute_exists/attribute_not_exists, SET/REMOVE/
 * ADD/DELETE). The adapter's rules (lock, fence, epoch CAS) stay in the adapter: the model only
 * evaluates the expressions it is sent.
 *
 * Faults, per calling machine: an outage (requests time out), throttling (ThrottlingException),
 * slow answers, and ambiguous outcomes (the write is applied, the answer is lost: the caller sees
 * a timeout).
 */

/** How long the SDK waits for an answer before it gives up with a TimeoutError. */
export const SDK_TIMEOUT_MS = 3000;

type Item = Record<string, unknown>;

/** A copy of an item (flat values and string sets): what leaves or enters the table is never shared. */
function copyItem(item: Item): Item {
  const copy: Item = {};
  for (const key of Object.keys(item)) copy[key] = copyValue(item[key]);
  return copy;
}

function copyValue(value: unknown): unknown {
  if (typeof value !== "object" || value === null) return value;
  if (value instanceof Set) return new Set(value);
  return deepCopy(value);
}

/**
 * What structuredClone gives for the plain data an item holds (objects, arrays, primitives, in
 * any depth), without its cost (issue 32); anything else goes to structuredClone.
 */
function deepCopy(value: unknown): unknown {
  if (typeof value !== "object" || value === null) return value;
  if (Array.isArray(value)) return value.map(deepCopy);
  if (Object.getPrototypeOf(value) !== Object.prototype) return structuredClone(value);
  const copy: Record<string, unknown> = {};
  for (const key of Object.keys(value)) copy[key] = deepCopy((value as Record<string, unknown>)[key]);
  return copy;
}

export interface CallerFaults {
  /** Probability that a request is answered ThrottlingException. */
  throttle?: number;
  /** Probability that a write is applied but its answer lost. */
  ambiguous?: number;
  /** Extra ms per answer. */
  slowMs?: number;
  /**
   * Per-operation faults: the probability that a read (Get, Query) or a write (Put, Update,
   * TransactWriteItems) of this machine fails, while the other kind goes through (one partition hot
   * or unreachable, an endpoint failing one API, a policy denying one action).
   */
  failReads?: number;
  failWrites?: number;
  /** How a failed operation fails: a 500 answer, or no answer (the SDK's timeout). @default "error" */
  failAs?: "error" | "timeout";
}

class ConditionFailed extends Error {
  override name = "ConditionalCheckFailedException";
  Item: Item | undefined;
  $metadata = { httpStatusCode: 400 };
  constructor(old: Item | undefined, returnOld: boolean) {
    super("The conditional request failed");
    if (returnOld) this.Item = old;
  }
}

function sdkError(name: string, message: string, status: number): Error {
  return Object.assign(new Error(message), { name, $metadata: { httpStatusCode: status } });
}

// ---- expressions ------------------------------------------------------------------------------

interface Context {
  readonly names: Record<string, string>;
  readonly values: Record<string, unknown>;
}

const TOKEN = /\s*(<>|<=|>=|[=<>(),+-]|[#:]?[A-Za-z_][A-Za-z0-9_]*)/y;

/**
 * Expression text -> its tokens. The adapter sends a few fixed expressions (values travel as
 * placeholders), thousands of times a run, and a Query evaluates its key condition once per item:
 * each is tokenized once (issue 32: tokenizing was the model's largest cost).
 */
const tokenCache = new Map<string, readonly string[]>();

function tokensOf(text: string): readonly string[] {
  let tokens = tokenCache.get(text);
  if (tokens === undefined) {
    tokens = tokenize(text);
    if (tokenCache.size < 10_000) tokenCache.set(text, tokens);
  }
  return tokens;
}

function tokenize(text: string): string[] {
  const tokens: string[] = [];
  TOKEN.lastIndex = 0;
  let index = 0;
  while (index < text.length) {
    if (/^\s*$/.test(text.slice(index))) break;
    TOKEN.lastIndex = index;
    const match = TOKEN.exec(text);
    if (!match) throw new Error(`cannot parse expression at ${text.slice(index)}`);
    tokens.push(match[1] as string);
    index = TOKEN.lastIndex;
  }
  return tokens;
}

class Parser {
  readonly tokens: readonly string[];
  position = 0;
  readonly ctx: Context;
  constructor(text: string, ctx: Context) {
    this.tokens = tokensOf(text);
    this.ctx = ctx;
  }
  peek(): string | undefined {
    return this.tokens[this.position];
  }
  take(expected?: string): string {
    const token = this.tokens[this.position++];
    if (token === undefined || (expected !== undefined && token.toUpperCase() !== expected))
      throw new Error(`expected ${expected ?? "a token"}, got ${token}`);
    return token;
  }
  name(token: string): string {
    return token.startsWith("#") ? (this.ctx.names[token] as string) : token;
  }
  operand(item: Item | undefined): unknown {
    const token = this.take();
    if (token.startsWith(":")) return this.ctx.values[token];
    if (token === "if_not_exists") {
      this.take("(");
      const path = this.name(this.take());
      this.take(",");
      const fallback = this.operand(item);
      this.take(")");
      return item?.[path] ?? fallback;
    }
    return item?.[this.name(token)];
  }
  // condition grammar
  or(item: Item | undefined): boolean {
    let value = this.and(item);
    while (this.peek()?.toUpperCase() === "OR") {
      this.take();
      const right = this.and(item);
      value = value || right;
    }
    return value;
  }
  and(item: Item | undefined): boolean {
    let value = this.not(item);
    while (this.peek()?.toUpperCase() === "AND") {
      this.take();
      const right = this.not(item);
      value = value && right;
    }
    return value;
  }
  not(item: Item | undefined): boolean {
    if (this.peek()?.toUpperCase() === "NOT") {
      this.take();
      return !this.not(item);
    }
    return this.primary(item);
  }
  primary(item: Item | undefined): boolean {
    const token = this.peek();
    if (token === "(") {
      this.take();
      const value = this.or(item);
      this.take(")");
      return value;
    }
    if (token === "attribute_exists" || token === "attribute_not_exists") {
      this.take();
      this.take("(");
      const path = this.name(this.take());
      this.take(")");
      const exists = item !== undefined && item[path] !== undefined;
      return token === "attribute_exists" ? exists : !exists;
    }
    const left = this.operand(item);
    const op = this.take();
    if (op.toUpperCase() === "IN") {
      this.take("(");
      const options = [this.operand(item)];
      while (this.peek() === ",") {
        this.take();
        options.push(this.operand(item));
      }
      this.take(")");
      return options.some((option) => left !== undefined && option === left);
    }
    const right = this.operand(item);
    return compare(left, op, right);
  }
}

function compare(left: unknown, op: string, right: unknown): boolean {
  if (left === undefined || right === undefined) return op === "<>" ? left !== right : false;
  if (typeof left !== typeof right) return op === "<>";
  const l = left as number | string;
  const r = right as number | string;
  switch (op) {
    case "=":
      return l === r;
    case "<>":
      return l !== r;
    case "<":
      return l < r;
    case "<=":
      return l <= r;
    case ">":
      return l > r;
    case ">=":
      return l >= r;
    default:
      throw new Error(`unknown comparator ${op}`);
  }
}

function conditionHolds(expression: string | undefined, item: Item | undefined, ctx: Context): boolean {
  if (expression === undefined) return true;
  const parser = new Parser(expression, ctx);
  const value = parser.or(item);
  if (parser.peek() !== undefined) throw new Error(`trailing tokens in ${expression}`);
  return value;
}

/**
 * The partition a key condition demands (`pk = :v`, alone or ANDed with more, no OR, NOT or
 * parentheses): no item of another partition can satisfy it, so a Query evaluates the condition
 * on that partition's items only, not on every item of the table (issue 32). Undefined: any other
 * form, every item is evaluated.
 */
function partitionOf(expression: string | undefined, ctx: Context): { value: unknown } | undefined {
  if (expression === undefined) return undefined;
  const tokens = tokensOf(expression);
  const [name, equals, placeholder, next] = tokens;
  if (name === undefined || placeholder === undefined || equals !== "=" || !placeholder.startsWith(":"))
    return undefined;
  if ((name.startsWith("#") ? ctx.names[name] : name) !== "pk") return undefined;
  if (next !== undefined && next.toUpperCase() !== "AND") return undefined;
  for (const token of tokens) {
    const upper = token.toUpperCase();
    if (upper === "OR" || upper === "NOT" || token === "(") return undefined;
  }
  return { value: ctx.values[placeholder] };
}

function applyUpdate(expression: string, item: Item, ctx: Context): Item {
  const parser = new Parser(expression, ctx);
  const next: Item = copyItem(item);
  let clause = "";
  while (parser.peek() !== undefined) {
    const upper = parser.peek()?.toUpperCase() as string;
    if (["SET", "REMOVE", "ADD", "DELETE"].includes(upper)) {
      clause = upper;
      parser.take();
      continue;
    }
    if (parser.peek() === ",") {
      parser.take();
      continue;
    }
    const path = parser.name(parser.take());
    if (clause === "SET") {
      parser.take("=");
      let value = parser.operand(item);
      while (parser.peek() === "+" || parser.peek() === "-") {
        const sign = parser.take();
        const right = Number(parser.operand(item));
        value = sign === "+" ? Number(value) + right : Number(value) - right;
      }
      next[path] = copyValue(value);
    } else if (clause === "REMOVE") {
      delete next[path];
    } else if (clause === "ADD") {
      const value = parser.operand(item);
      if (value instanceof Set) {
        const set = new Set(next[path] instanceof Set ? (next[path] as Set<unknown>) : []);
        for (const element of value) set.add(element);
        next[path] = set;
      } else next[path] = Number(next[path] ?? 0) + Number(value);
    } else if (clause === "DELETE") {
      const value = parser.operand(item) as Set<unknown>;
      if (next[path] instanceof Set) {
        const set = new Set(next[path] as Set<unknown>);
        for (const element of value) set.delete(element);
        // DynamoDB drops an emptied set attribute.
        if (set.size === 0) delete next[path];
        else next[path] = set;
      }
    } else throw new Error(`update expression without a clause: ${expression}`);
  }
  return next;
}

// ---- the table --------------------------------------------------------------------------------

interface WriteRequest {
  readonly kind: "Put" | "Update" | "Delete" | "ConditionCheck";
  readonly input: Record<string, unknown>;
}

export class DynamoTable {
  /** `pk\u0000sk` -> item. */
  readonly items = new Map<string, Item>();
  /** Requests served, by command name (a measure of work). */
  readonly calls = new Map<string, number>();

  static keyOf(key: Record<string, unknown>): string {
    return `${String(key.pk)}\u0000${String(key.sk)}`;
  }

  get(key: Record<string, unknown>): Item | undefined {
    const item = this.items.get(DynamoTable.keyOf(key));
    return item === undefined ? undefined : copyItem(item);
  }

  /** The stored item itself, not a copy, for the simulator's own reads: never to be changed. */
  peek(key: Record<string, unknown>): Readonly<Item> | undefined {
    return this.items.get(DynamoTable.keyOf(key));
  }

  /** Checks one write's condition and returns the item it leaves (undefined: deleted/none), or throws ConditionFailed. */
  #evaluate(request: WriteRequest): { key: string; next: Item | undefined; changes: boolean } {
    const input = request.input;
    const ctx: Context = {
      names: (input.ExpressionAttributeNames ?? {}) as Record<string, string>,
      values: (input.ExpressionAttributeValues ?? {}) as Record<string, unknown>,
    };
    const keySource = (request.kind === "Put" ? input.Item : input.Key) as Record<string, unknown>;
    const key = DynamoTable.keyOf(keySource);
    const current = this.items.get(key);
    if (!conditionHolds(input.ConditionExpression as string | undefined, current, ctx))
      throw new ConditionFailed(current, input.ReturnValuesOnConditionCheckFailure === "ALL_OLD");
    switch (request.kind) {
      case "Put":
        return { key, next: copyItem(input.Item as Item), changes: true };
      case "Delete":
        return { key, next: undefined, changes: true };
      case "ConditionCheck":
        return { key, next: current, changes: false };
      case "Update": {
        const base: Item = current ?? { pk: keySource.pk, sk: keySource.sk };
        return { key, next: applyUpdate(input.UpdateExpression as string, base, ctx), changes: true };
      }
    }
  }

  #commit(key: string, next: Item | undefined): void {
    if (next === undefined) this.items.delete(key);
    else this.items.set(key, next);
  }

  /** Runs one command (by the DocumentClient command's class name) and returns its output. */
  execute(name: string, input: Record<string, unknown>): Record<string, unknown> {
    this.calls.set(name, (this.calls.get(name) ?? 0) + 1);
    switch (name) {
      case "GetCommand":
        return { Item: this.get(input.Key as Item) };
      case "PutCommand":
      case "UpdateCommand":
      case "DeleteCommand": {
        const kind = name === "PutCommand" ? "Put" : name === "UpdateCommand" ? "Update" : "Delete";
        const result = this.#evaluate({ kind, input });
        const old = this.items.get(result.key);
        this.#commit(result.key, result.next);
        if (input.ReturnValues === "ALL_OLD") return { Attributes: old && copyItem(old) };
        if (input.ReturnValues === "ALL_NEW") return { Attributes: result.next && copyItem(result.next) };
        return {};
      }
      case "QueryCommand":
        return this.#query(input);
      case "TransactWriteCommand":
        return this.#transact(input);
      default:
        throw sdkError("UnknownOperationException", `the model does not serve ${name}`, 400);
    }
  }

  #query(input: Record<string, unknown>): Record<string, unknown> {
    const ctx: Context = {
      names: (input.ExpressionAttributeNames ?? {}) as Record<string, string>,
      values: (input.ExpressionAttributeValues ?? {}) as Record<string, unknown>,
    };
    const expression = input.KeyConditionExpression as string;
    const partition = partitionOf(expression, ctx);
    const candidates =
      partition === undefined
        ? [...this.items.values()]
        : [...this.items.values()].filter(
            (item) => partition.value !== undefined && item.pk === partition.value,
          );
    let matches = candidates.filter((item) => conditionHolds(expression, item, ctx));
    matches.sort((a, b) => {
      const pa = String(a.pk);
      const pb = String(b.pk);
      if (pa !== pb) return pa < pb ? -1 : 1;
      const sa = String(a.sk);
      const sb = String(b.sk);
      return sa < sb ? -1 : sa > sb ? 1 : 0;
    });
    if (input.ScanIndexForward === false) matches.reverse();
    const start = input.ExclusiveStartKey as Item | undefined;
    if (start !== undefined) {
      const at = matches.findIndex((item) => item.pk === start.pk && item.sk === start.sk);
      matches = matches.slice(at + 1);
    }
    const limit = input.Limit as number | undefined;
    let last: Item | undefined;
    if (limit !== undefined && matches.length > limit) {
      matches = matches.slice(0, limit);
      const tail = matches[matches.length - 1] as Item;
      last = { pk: tail.pk, sk: tail.sk };
    }
    return {
      Items: matches.map((item) => copyItem(item)),
      Count: matches.length,
      LastEvaluatedKey: last,
    };
  }

  #transact(input: Record<string, unknown>): Record<string, unknown> {
    const entries = (input.TransactItems as Array<Record<string, Record<string, unknown>>>).map((entry) => {
      const kind = Object.keys(entry)[0] as WriteRequest["kind"];
      return { kind, input: entry[kind] as Record<string, unknown> };
    });
    const results: Array<{ key: string; next: Item | undefined; changes: boolean }> = [];
    const reasons: Array<{ Code: string }> = [];
    let failed = false;
    for (const entry of entries) {
      try {
        results.push(this.#evaluate(entry));
        reasons.push({ Code: "None" });
      } catch (error) {
        if (!(error instanceof ConditionFailed)) throw error;
        failed = true;
        reasons.push({ Code: "ConditionalCheckFailed" });
      }
    }
    if (failed) {
      throw Object.assign(new Error("Transaction cancelled"), {
        name: "TransactionCanceledException",
        CancellationReasons: reasons,
        $metadata: { httpStatusCode: 400 },
      });
    }
    for (const result of results) if (result.changes) this.#commit(result.key, result.next);
    return {};
  }
}

/** How one calling process reaches AWS: its scheduler host, the network, the faults per machine. */
export interface AwsTransport {
  readonly sched: Scheduler;
  readonly net: Network;
  /** The calling process (a scheduler host). */
  readonly caller: () => string;
  readonly faults: (machine: string) => CallerFaults | undefined;
  /** Called after a write of `caller` was applied to the table (the nemesis's hook). */
  readonly applied?: (caller: string, command: string) => void;
}

/** The DocumentClient of one calling process, its requests crossing the simulated network. */
export class SimDynamoClient {
  readonly #table: DynamoTable;
  readonly #transport: AwsTransport;
  /** Called with each answer's Date header and the caller's monotonic send/receive instants (AwsClock.observe). */
  readonly #observe: ((date: string, sentAt: number, receivedAt: number) => void) | undefined;
  readonly #monotonic: () => number;

  constructor(
    transport: AwsTransport,
    options: {
      table: DynamoTable;
      observe?: (date: string, sentAt: number, receivedAt: number) => void;
      monotonic: () => number;
    },
  ) {
    this.#transport = transport;
    this.#table = options.table;
    this.#observe = options.observe;
    this.#monotonic = options.monotonic;
  }

  send(
    command: { constructor: { name: string }; input: unknown },
    options?: { abortSignal?: AbortSignal },
  ): Promise<never> {
    const { sched, caller } = this.#transport;
    return callAws(
      this.#transport,
      options?.abortSignal,
      (reply) => {
        const name = command.constructor.name;
        const faults = this.#transport.faults(machineOf(caller()));
        if (faults?.throttle !== undefined && sched.random.chance(faults.throttle))
          return reply({
            error: sdkError("ThrottlingException", "Rate of requests exceeds the allowed throughput", 400),
          });
        const write = name !== "GetCommand" && name !== "QueryCommand";
        const failing = write ? faults?.failWrites : faults?.failReads;
        if (failing !== undefined && sched.random.chance(failing)) {
          if (faults?.failAs === "timeout") return;
          return reply({
            error: sdkError("InternalServerError", "Internal server error", 500),
          });
        }
        let result: { value?: unknown; error?: unknown };
        try {
          result = { value: this.#table.execute(name, command.input as Record<string, unknown>) };
        } catch (error) {
          result = { error };
        }
        const lost = write && faults?.ambiguous !== undefined && sched.random.chance(faults.ambiguous);
        reply(result, lost);
        if (write && result.error === undefined) this.#transport.applied?.(caller(), name);
      },
      (sentAt) => {
        this.#observe?.(new Date(sched.now).toUTCString(), sentAt, this.#monotonic());
      },
      this.#monotonic,
    ) as Promise<never>;
  }

  destroy(): void {}
}

/**
 * One AWS request: to the `aws` machine and back on a fresh connection. A cut path or a lost
 * answer ends in the SDK's TimeoutError after SDK_TIMEOUT_MS; an abort in AbortError.
 */
export function callAws(
  transport: AwsTransport,
  signal: AbortSignal | undefined,
  serve: (reply: (result: { value?: unknown; error?: unknown }, lost?: boolean) => void) => void,
  answered?: (sentAt: number) => void,
  monotonic?: () => number,
  timeoutMs = SDK_TIMEOUT_MS,
): Promise<unknown> {
  const { sched, net, faults } = transport;
  const caller = transport.caller();
  const channel: Channel = Network.channel();
  const back: Channel = Network.channel();
  const sentAt = monotonic?.() ?? 0;
  return new Promise((resolve, reject) => {
    let done = false;
    const finish = (fn: () => void) => {
      if (done) return;
      done = true;
      sched.cancel(timer);
      signal?.removeEventListener("abort", onAbort);
      channel.closed = true;
      back.closed = true;
      fn();
    };
    const timer = sched.schedule(timeoutMs, () =>
      finish(() => reject(sdkError("TimeoutError", `request timed out after ${timeoutMs} ms`, 0))),
    );
    const onAbort = () =>
      finish(() => reject(Object.assign(new Error("Request aborted"), { name: "AbortError" })));
    if (signal?.aborted) return onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    net.send(channel, caller, "aws/service", () =>
      serve((result, lost) => {
        if (lost) return;
        const slow = faults(machineOf(caller))?.slowMs ?? 0;
        if (slow > 0) back.lastAt = Math.max(back.lastAt, sched.now + slow);
        net.send(back, "aws/service", caller, () =>
          finish(() => {
            answered?.(sentAt);
            if (result.error !== undefined) reject(result.error);
            else resolve(result.value);
          }),
        );
      }),
    );
  });
}
