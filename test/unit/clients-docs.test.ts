import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { haproxyConfig } from "../../src/dev/local-stack/haproxy.ts";

/** docs/clients.md's haproxy.cfg is the one the HAProxy test and the `haproxy` benchmark row run. */
describe("docs/clients.md", () => {
  it("shows the haproxy.cfg that src/dev/local-stack/haproxy.ts writes, for three example nodes", () => {
    // Prepare
    const doc = readFileSync(new URL("../../docs/clients.md", import.meta.url), "utf8");
    const shown = /```haproxy\n([\s\S]*?)```/.exec(doc)?.[1];

    // Act
    const written = haproxyConfig(":6379", "/run/haproxy/admin.sock", [
      { id: "n1", redis: "10.0.1.10:6379", http: "10.0.1.10:8008" },
      { id: "n2", redis: "10.0.2.10:6379", http: "10.0.2.10:8008" },
      { id: "n3", redis: "10.0.3.10:6379", http: "10.0.3.10:8008" },
    ]);

    // Assess
    expect(shown).toBe(written);
  });
});
