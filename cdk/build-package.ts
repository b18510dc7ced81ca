/**
 * `npm run build` (run by `npm pack` through prepack): the published package's code, each part one
 * ES module with its npm dependencies inlined, so the package needs no runtime dependency at all
 * (an agent node installs a few MB, not the SDK's and the emulators' trees) and no TypeScript runs
 * under node_modules (Node refuses to strip types there):
 *
 * - dist/src/cli/main.js: the `shardguard` command (bin/shardguard.js runs it);
 * - dist/cdk/index.js: the construct and the stack (cdk/index.ts), with aws-cdk-lib, constructs and
 *   cdk-nag left to the consumer's app (peer dependencies);
 * - dist/client/index.js: the primary resolver for applications (src/client/index.ts, `shardguard/client`);
 * - dist/controller-lambda/index.mjs: the controller Lambda, deployed as it is by the packed
 *   construct (no esbuild, no lock file in the consumer's app);
 * - dist/types/: declarations (tsc -p tsconfig.build.json, run before this script).
 */
import { rmSync } from "node:fs";
import path from "node:path";
import { type BuildOptions, build } from "esbuild";
import {
  CONTROLLER_BUNDLE_DIR,
  CONTROLLER_BUNDLE_OPTIONS,
  DEFAULT_CONTROLLER_ENTRY,
  PACKAGE_ROOT,
} from "./controller-props.ts";

const common: BuildOptions = {
  bundle: true,
  platform: "node",
  format: "esm",
  target: CONTROLLER_BUNDLE_OPTIONS.target,
  mainFields: [...CONTROLLER_BUNDLE_OPTIONS.mainFields],
  banner: { js: CONTROLLER_BUNDLE_OPTIONS.banner },
  minify: true,
  sourcemap: true,
  sourcesContent: false,
  logLevel: "warning",
};
const dist = (...parts: string[]) => path.join(PACKAGE_ROOT, "dist", ...parts);

for (const dir of ["src", "cdk", "client", "controller-lambda"])
  rmSync(dist(dir), { recursive: true, force: true });
await Promise.all([
  build({
    ...common,
    entryPoints: [path.join(PACKAGE_ROOT, "src", "cli", "main.ts")],
    // Where the demo's local cluster finds the CLI it starts its agents with (src/dev/local-cluster.ts).
    outfile: dist("src", "cli", "main.js"),
  }),
  build({
    ...common,
    entryPoints: [path.join(PACKAGE_ROOT, "cdk", "index.ts")],
    outfile: dist("cdk", "index.js"),
    external: ["aws-cdk-lib", "aws-cdk-lib/*", "constructs", "cdk-nag"],
  }),
  build({
    ...common,
    entryPoints: [path.join(PACKAGE_ROOT, "src", "client", "index.ts")],
    outfile: dist("client", "index.js"),
  }),
  build({
    ...common,
    entryPoints: [DEFAULT_CONTROLLER_ENTRY],
    outfile: path.join(CONTROLLER_BUNDLE_DIR, "index.mjs"),
  }),
]);
process.stdout.write(
  "built dist/src/cli/main.js, dist/cdk/index.js, dist/client/index.js, dist/controller-lambda/index.mjs\n",
);
