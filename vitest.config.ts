import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    // The integration project's global teardown checks every recorded AWS call against the
    // synthesized IAM policies (test/support/global-setup.ts): a CDK synth and a simulation per
    // distinct call, tens of seconds on a loaded machine. Past this, vitest would exit before it ends.
    teardownTimeout: 180_000,
    // A test that passes only on its retry is listed at the end of the run (test/support/flaky-reporter.ts).
    reporters: ["default", "./test/support/flaky-reporter.ts"],
    projects: [
      {
        test: {
          name: "unit",
          include: ["test/unit/**/*.test.ts"],
        },
      },
      {
        test: {
          name: "integration",
          include: ["test/integration/**/*.test.ts"],
          globalSetup: ["test/support/global-setup.ts"],
          testTimeout: 60_000,
          hookTimeout: 60_000,
          // Real processes on two cores: keep a few files at a time so timing checks stay meaningful.
          maxWorkers: 2,
          // Real processes on a shared machine: a failed test runs once more, and one that passes only
          // then is listed as flaky at the end of the run (a bug to fix, never a pass to forget).
          retry: 1,
        },
      },
    ],
  },
});
