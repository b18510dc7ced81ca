import { createServer, type IncomingMessage, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * An HTTP proxy in front of one local AWS emulator (DynamoDB Local or the SQS emulator) that
 * counts every request by API operation, from every process that talks through it (agents,
 * controllers, the bench itself). The operation comes from the `X-Amz-Target` header (DynamoDB
 * and SQS JSON protocol) or the `Action` parameter (SQS query protocol); a Query also names the
 * partition it read: `Query (shard)`, `Query (node)`, `Query (control)`, `Query (shard index)`, `Query (history)`.
 *
 * For DynamoDB it also asks for the capacity each request consumed (`ReturnConsumedCapacity:
 * TOTAL`, added to requests that did not set it) and sums the `CapacityUnits` of the answers, so
 * on-demand request units are measured with DynamoDB Local's own item-size accounting.
 */

export interface OperationCount {
  requests: number;
  /** Capacity units the answers reported (DynamoDB only; 0 where none was reported). */
  capacityUnits: number;
  /** HTTP status >= 400 (conditional-check failures included). */
  errors: number;
}

export class CountingProxy {
  readonly #server: Server;
  readonly #target: URL;
  readonly #capacity: boolean;
  #counts = new Map<string, OperationCount>();

  private constructor(target: URL, capacity: boolean) {
    this.#target = target;
    this.#capacity = capacity;
    this.#server = createServer((req, res) => {
      void this.#forward(req, res.writeHead.bind(res), (body) => res.end(body)).catch((error: unknown) => {
        res.writeHead(502);
        res.end(String(error));
      });
    });
  }

  /** Starts a proxy on a free 127.0.0.1 port forwarding to `target`. */
  static async start(target: string, options: { capacity?: boolean } = {}): Promise<CountingProxy> {
    const proxy = new CountingProxy(new URL(target), options.capacity ?? false);
    await new Promise<void>((resolve) => proxy.#server.listen(0, "127.0.0.1", resolve));
    return proxy;
  }

  get url(): string {
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
  }

  /** The counts since the last reset, keyed by operation (`PutItem`, `ReceiveMessage`, ...). */
  snapshot(): Record<string, OperationCount> {
    return Object.fromEntries(
      [...this.#counts].sort(([a], [b]) => a.localeCompare(b)).map(([k, v]) => [k, { ...v }]),
    );
  }

  reset(): void {
    this.#counts = new Map();
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  async #forward(
    req: IncomingMessage,
    writeHead: (status: number, headers: Record<string, string | string[] | undefined>) => unknown,
    end: (body: Buffer) => void,
  ): Promise<void> {
    let body = await readAll(req);
    const target = String(req.headers["x-amz-target"] ?? "");
    let operation = target.includes(".") ? target.slice(target.lastIndexOf(".") + 1) : "";
    if (!operation) operation = new URLSearchParams(body.toString("utf8")).get("Action") ?? "Unknown";
    if (operation === "Query") operation = `Query ${queriedPartition(body.toString("utf8"))}`;
    const headers = { ...req.headers, host: this.#target.host };
    const measureCapacity = this.#capacity && target.startsWith("DynamoDB_");
    if (measureCapacity && body.length > 0) {
      const parsed = JSON.parse(body.toString("utf8")) as Record<string, unknown>;
      if (parsed.ReturnConsumedCapacity === undefined || parsed.ReturnConsumedCapacity === "NONE") {
        parsed.ReturnConsumedCapacity = "TOTAL";
        body = Buffer.from(JSON.stringify(parsed));
        headers["content-length"] = String(body.length);
      }
    }
    const answer = await new Promise<{ status: number; headers: IncomingMessage["headers"]; body: Buffer }>(
      (resolve, reject) => {
        const out = request(
          {
            host: this.#target.hostname,
            port: this.#target.port,
            method: req.method,
            path: req.url,
            headers,
          },
          (res) => {
            void readAll(res).then(
              (body) => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }),
              reject,
            );
          },
        );
        out.on("error", reject);
        out.end(body);
      },
    );
    const count = this.#entry(operation);
    count.requests += 1;
    if (answer.status >= 400) count.errors += 1;
    if (measureCapacity && answer.status < 400 && answer.body.length > 0) {
      count.capacityUnits += consumedUnits(
        JSON.parse(answer.body.toString("utf8")) as Record<string, unknown>,
      );
    }
    writeHead(answer.status, answer.headers);
    end(answer.body);
  }

  #entry(operation: string): OperationCount {
    let count = this.#counts.get(operation);
    if (!count) {
      count = { requests: 0, capacityUnits: 0, errors: 0 };
      this.#counts.set(operation, count);
    }
    return count;
  }
}

async function readAll(stream: AsyncIterable<Buffer>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/**
 * Which kind of partition a Query reads: the shard index, one shard's partition (its members), one
 * node's partition (heartbeat, replica set), its controller's partition (topology, lock), or its history.
 */
function queriedPartition(body: string): string {
  const match = /"S":"(SHARDS|SHARD#|NODE#|CONTROL#|HISTORY#)/.exec(body);
  if (match?.[1] === "SHARDS") return "(shard index)";
  if (match?.[1] === "HISTORY#") return "(history)";
  if (match?.[1] === "CONTROL#") return "(control)";
  if (match?.[1] === "NODE#") return "(node)";
  return match ? "(shard)" : "(other)";
}

/** Sum of `ConsumedCapacity[].CapacityUnits` (an object for single-item calls, a list for batches). */
function consumedUnits(answer: Record<string, unknown>): number {
  const consumed = answer.ConsumedCapacity;
  const list = Array.isArray(consumed) ? consumed : consumed ? [consumed] : [];
  return list.reduce((sum: number, entry: { CapacityUnits?: number }) => sum + (entry.CapacityUnits ?? 0), 0);
}
