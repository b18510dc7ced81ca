import type { Reporter, TestCase, TestModule } from "vitest/node";

/**
 * Lists, at the end of a run, every test that passed only on a retry (the integration project
 * retries a failed test once: real processes on a shared two-core machine). A test listed here is a
 * bug to fix, in the test or in the product, and its first failure is printed so it can be: the
 * retry keeps a timing accident from failing the run, it does not hide it.
 */
export default class FlakyReporter implements Reporter {
  readonly #flaky: TestCase[] = [];

  onTestCaseResult(testCase: TestCase): void {
    if (testCase.diagnostic()?.flaky) this.#flaky.push(testCase);
  }

  onTestRunEnd(_modules: ReadonlyArray<TestModule>): void {
    if (this.#flaky.length === 0) return;
    const lines = [`\n[flaky] ${this.#flaky.length} test(s) passed only on a retry; each is a bug to fix:`];
    for (const testCase of this.#flaky) {
      lines.push(
        `[flaky]   ${testCase.module.moduleId.replace(`${process.cwd()}/`, "")} > ${testCase.fullName}`,
      );
      for (const error of testCase.result().errors ?? []) {
        lines.push(`[flaky]     first failure: ${(error.message ?? String(error)).split("\n")[0]}`);
      }
    }
    process.stdout.write(`${lines.join("\n")}\n`);
  }
}
