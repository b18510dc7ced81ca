import { Duration } from "aws-cdk-lib";
import { describe, expect, it } from "vitest";
import { defaultControllerMemoryMb, modeledPassMs } from "../../cdk/controller-memory.ts";
import { resolveControllerProps } from "../../cdk/controller-props.ts";

describe("controller memory sized from the fleet", () => {
  it.each([
    // shards, partitions, MB: the smallest size whose modeled pass fits 700 ms and holds the controller
    [1, 1, 128],
    [10, 1, 128],
    [100, 1, 192],
    [300, 1, 512],
    [1000, 7, 256],
    [5000, 17, 512],
  ])("%i shards over %i partition(s): %i MB", (shards, partitions, memory) => {
    expect(defaultControllerMemoryMb(shards, partitions)).toBe(memory);
    expect(modeledPassMs(Math.ceil(shards / partitions), memory)).toBeLessThanOrEqual(700);
  });

  it("keeps 512 MB without a shard count, and stops at one vCPU when one partition is too small", () => {
    expect(defaultControllerMemoryMb(undefined)).toBe(512);
    expect(defaultControllerMemoryMb(1000, 1)).toBe(1769);
    expect(modeledPassMs(1000, 1769)).toBeGreaterThan(700);
  });

  it("is the construct's default, and an explicit size still wins", () => {
    const base = { controllerTimeout: Duration.seconds(75) };
    expect(resolveControllerProps({ ...base }).controllerMemorySize).toBe(512);
    expect(resolveControllerProps({ ...base, shards: 1 }).controllerMemorySize).toBe(128);
    expect(resolveControllerProps({ ...base, shards: 1000, partitions: 7 }).controllerMemorySize).toBe(256);
    expect(
      resolveControllerProps({ ...base, shards: 1, controllerMemorySize: 1024 }).controllerMemorySize,
    ).toBe(1024);
  });
});
