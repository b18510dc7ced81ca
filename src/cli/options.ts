import { type Command, InvalidArgumentError } from "commander";
import { plainText, type Setting } from "../adapters/settings.ts";

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

/**
 * Registers a flag for every setting that has one, with the help text the docs table shows
 * (plain text), its default and its variable: the settings list is the only declaration.
 */
export function addSettingOptions(command: Command, settings: readonly Setting[]): Command {
  for (const setting of settings) {
    if (!setting.flag) continue;
    const spelling = setting.placeholder ? `${setting.flag} ${setting.placeholder}` : setting.flag;
    const fallback = setting.default === "required" ? "required" : `default ${plainText(setting.default)}`;
    command.option(spelling, `${plainText(setting.description)} (${fallback}; ${setting.env})`);
  }
  return command;
}
