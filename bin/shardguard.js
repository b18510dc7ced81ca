#!/usr/bin/env node
// The published package runs the compiled dist/ (Node does not strip types under node_modules);
// a checkout runs the TypeScript sources directly (Node >= 22.18 strips types).
import { existsSync } from "node:fs";

const [major = 0, minor = 0] = process.versions.node.split(".").map(Number);
if (major < 22 || (major === 22 && minor < 18)) {
  process.stderr.write(
    `shardguard: Node.js >= 22.18 is required, this is ${process.version}; ` +
      "install Node 22.18+ (in a checkout, npm ci installs Node 24 for npm run scripts)\n",
  );
  process.exit(1);
}

const built = new URL("../dist/src/cli/main.js", import.meta.url);
const { main } = existsSync(built) ? await import(built.href) : await import("../src/cli/main.ts");
await main(process.argv);
