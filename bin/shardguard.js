#!/usr/bin/env node
// The published package runs the bundle in dist/ (Node does not strip types under node_modules);
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

// A checkout has src/ (and may have a dist/ from an earlier npm pack, possibly stale): run the
// sources. The package ships no src/, only the bundle npm pack built.
const sources = new URL("../src/cli/main.ts", import.meta.url);
const { main } = existsSync(sources)
  ? await import(sources.href)
  : await import(new URL("../dist/src/cli/main.js", import.meta.url).href);
await main(process.argv);
