import { InvalidArgumentError } from "commander";

/** A commander parser for an integer flag within [min, max], with a message naming the range. */
export function parseIntegerOption(min: number, max: number) {
  return (value: string): number => {
    const parsed = Number(value);
    if (!Number.isInteger(parsed) || parsed < min || parsed > max) {
      throw new InvalidArgumentError(`expected an integer from ${min} to ${max}, got "${value}"`);
    }
    return parsed;
  };
}
