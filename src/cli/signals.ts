/** Resolves with the first SIGINT or SIGTERM; afterwards the default handlers are back. */
export function untilSignal(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    const handler = (signal: NodeJS.Signals) => {
      process.off("SIGINT", handler);
      process.off("SIGTERM", handler);
      resolve(signal);
    };
    process.on("SIGINT", handler);
    process.on("SIGTERM", handler);
  });
}

/** An AbortSignal that fires on the first SIGINT or SIGTERM, for long-running commands. */
export function abortOnSignal(): AbortController {
  const controller = new AbortController();
  void untilSignal().then((signal) => controller.abort(new Error(`${signal} received`)));
  return controller;
}
