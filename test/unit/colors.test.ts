import { describe, expect, it } from "vitest";
import { colorWanted } from "../../src/cli/colors.ts";

describe("colorWanted", () => {
  it.each([
    { env: {}, tty: true, want: true, why: "a terminal" },
    { env: {}, tty: false, want: false, why: "a pipe" },
    { env: {}, tty: undefined, want: false, why: "no stream information" },
    {
      env: { CI: "true" },
      tty: false,
      want: false,
      why: "a pipe on a CI machine (picocolors would colour it)",
    },
    { env: { TERM: "dumb" }, tty: true, want: false, why: "a dumb terminal" },
    { env: { NO_COLOR: "1" }, tty: true, want: false, why: "NO_COLOR on a terminal" },
    { env: { NO_COLOR: "" }, tty: true, want: true, why: "an empty NO_COLOR is unset" },
    { env: { FORCE_COLOR: "1" }, tty: false, want: true, why: "FORCE_COLOR into a pipe" },
    { env: { FORCE_COLOR: "0" }, tty: true, want: true, why: "FORCE_COLOR=0 leaves the terminal default" },
    { env: { FORCE_COLOR: "0" }, tty: false, want: false, why: "FORCE_COLOR=0 into a pipe" },
    { env: { NO_COLOR: "1", FORCE_COLOR: "1" }, tty: true, want: false, why: "NO_COLOR wins" },
  ])("$why -> $want", ({ env, tty, want }) => {
    expect(colorWanted(env, tty)).toBe(want);
  });
});
