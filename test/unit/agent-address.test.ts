import { execFile } from "node:child_process";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { resolveAdvertisedAddress } from "../../src/agent/options.ts";

/**
 * The address an agent advertises when --address is absent (issue 17, item 1): the ECS task
 * metadata endpoint and IMDSv2 are stood in for by one HTTP server on 127.0.0.1 that answers as
 * they do (paths, the IMDSv2 token handshake, the container document's Networks).
 */

type Route = (request: IncomingMessage) => { status: number; body: string };

let server: Server;
let base: string;
const routes = new Map<string, Route>();
const seen: { method: string; url: string; token?: string }[] = [];

beforeAll(async () => {
  server = createServer((request, response) => {
    seen.push({
      method: request.method ?? "",
      url: request.url ?? "",
      token: request.headers["x-aws-ec2-metadata-token"] as string | undefined,
    });
    const route = routes.get(`${request.method} ${request.url}`);
    const { status, body } = route ? route(request) : { status: 404, body: "not found" };
    response.writeHead(status).end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(() => new Promise((resolve) => server.close(resolve)));

function ecsContainer(path: string, networkMode: string, ips: string[]) {
  routes.set(`GET ${path}`, () => ({
    status: 200,
    body: JSON.stringify({
      Name: "shardguard-agent",
      Networks: [{ NetworkMode: networkMode, IPv4Addresses: ips }],
    }),
  }));
}

function imds(path: string, ip: string) {
  routes.set(`PUT ${path}/latest/api/token`, (request) =>
    request.headers["x-aws-ec2-metadata-token-ttl-seconds"]
      ? { status: 200, body: "token-1" }
      : { status: 400, body: "no ttl" },
  );
  routes.set(`GET ${path}/latest/meta-data/local-ipv4`, (request) =>
    request.headers["x-aws-ec2-metadata-token"] === "token-1"
      ? { status: 200, body: ip }
      : { status: 401, body: "IMDSv2 token required" },
  );
}

/** The environment of a node in an account: no endpoint overrides. */
const inAccount = (extra: Record<string, string>) => ({ AWS_REGION: "eu-west-1", ...extra });

describe("advertised address", () => {
  it("keeps an explicit --address and asks no metadata service", async () => {
    // Act
    const result = await resolveAdvertisedAddress(
      { redis: "127.0.0.1:6379", address: "10.0.1.11:6379" },
      { env: inAccount({ ECS_CONTAINER_METADATA_URI_V4: `${base}/never` }) },
    );

    // Assess
    expect(result).toEqual({ address: "10.0.1.11:6379", source: "--address" });
    expect(seen.filter((request) => request.url === "/never")).toEqual([]);
  });

  it("uses --redis itself when it is not a loopback address", async () => {
    const result = await resolveAdvertisedAddress({ redis: "10.0.1.12:6379" }, { env: inAccount({}) });

    expect(result).toEqual({ address: undefined, source: "--redis" });
  });

  it("keeps loopback when every AWS endpoint is on this host (the local stack)", async () => {
    const result = await resolveAdvertisedAddress(
      { redis: "127.0.0.1:6379" },
      {
        env: {
          AWS_ENDPOINT_URL_DYNAMODB: "http://127.0.0.1:8000",
          AWS_ENDPOINT_URL_SQS: "http://localhost:9324",
        },
      },
    );

    expect(result).toEqual({ address: undefined, source: "local endpoints" });
  });

  it("takes the task's IPv4 address from the ECS task metadata in awsvpc mode, with the --redis port", async () => {
    // Prepare
    ecsContainer("/v4/awsvpc", "awsvpc", ["10.0.2.106"]);

    // Act
    const result = await resolveAdvertisedAddress(
      { redis: "127.0.0.1:6380" },
      { env: inAccount({ ECS_CONTAINER_METADATA_URI_V4: `${base}/v4/awsvpc` }) },
    );

    // Assess
    expect(result).toEqual({ address: "10.0.2.106:6380", source: "ECS task metadata" });
  });

  it("asks IMDSv2 (token first) for the instance's address in ECS host mode", async () => {
    // Prepare
    ecsContainer("/v4/host", "host", []);
    imds("/imds-a", "10.0.1.17");

    // Act
    const result = await resolveAdvertisedAddress(
      { redis: "localhost:6379" },
      {
        env: inAccount({
          ECS_CONTAINER_METADATA_URI_V4: `${base}/v4/host`,
          AWS_EC2_METADATA_SERVICE_ENDPOINT: `${base}/imds-a`,
        }),
      },
    );

    // Assess
    expect(result).toEqual({ address: "10.0.1.17:6379", source: "EC2 instance metadata" });
    const imdsRequests = seen.filter((request) => request.url.startsWith("/imds-a"));
    expect(imdsRequests.map((request) => `${request.method} ${request.url}`)).toEqual([
      "PUT /imds-a/latest/api/token",
      "GET /imds-a/latest/meta-data/local-ipv4",
    ]);
    expect(imdsRequests[1]?.token).toBe("token-1");
  });

  it("asks IMDSv2 on EC2 (a systemd unit with --redis 127.0.0.1)", async () => {
    // Prepare
    imds("/imds-b", "10.0.1.18");

    // Act
    const result = await resolveAdvertisedAddress(
      { redis: "127.0.0.1:6379" },
      { env: inAccount({ AWS_EC2_METADATA_SERVICE_ENDPOINT: `${base}/imds-b/` }) },
    );

    // Assess
    expect(result).toEqual({ address: "10.0.1.18:6379", source: "EC2 instance metadata" });
  });

  it.each([
    [
      "ECS bridge mode (ports are mapped)",
      () => {
        ecsContainer("/v4/bridge", "bridge", ["172.17.0.2"]);
        return inAccount({ ECS_CONTAINER_METADATA_URI_V4: `${base}/v4/bridge` });
      },
      /network mode bridge maps ports/,
    ],
    [
      "instance metadata turned off",
      () => inAccount({ AWS_EC2_METADATA_DISABLED: "true" }),
      /AWS_EC2_METADATA_DISABLED=true/,
    ],
    [
      "no metadata service answering",
      () => inAccount({ AWS_EC2_METADATA_SERVICE_ENDPOINT: `${base}/nothing-here` }),
      /EC2 instance metadata http:\/\/127\.0\.0\.1:\d+\/nothing-here: HTTP 404/,
    ],
  ])("refuses to advertise loopback with %s, saying what to set", async (_case, env, tried) => {
    // Act
    const result = resolveAdvertisedAddress({ redis: "127.0.0.1:6379" }, { env: env() });

    // Assess
    await expect(result).rejects.toThrow(
      /--redis 127\.0\.0\.1:6379 is a loopback address and no --address \(SHARDGUARD_ADDRESS\) was given/,
    );
    await expect(result).rejects.toThrow(tried);
  });

  // A child process loading the CLI: about 1 s alone, over the default 5 s at load 16-19.
  it("stops `shardguard agent` before it touches AWS, with the message on stderr", {
    timeout: 30_000,
  }, async () => {
    // Act
    const failure = await promisify(execFile)(
      process.execPath,
      ["src/cli/main.ts", "agent", "--shard", "orders", "--node-id", "n1", "--redis", "127.0.0.1:6379"],
      { env: { PATH: process.env.PATH, HOME: process.env.HOME, AWS_EC2_METADATA_DISABLED: "true" } },
    ).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    );

    // Assess
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toMatch(/^shardguard: --redis 127\.0\.0\.1:6379 is a loopback address/);
  });
});
