import { ConfigurationError } from "./errors.ts";

/** A database's `host:port`, split. */
export interface Address {
  readonly host: string;
  readonly port: number;
}

/** An address `parseAddress` refuses; names the address and what is wrong with it. */
export class MalformedAddress extends ConfigurationError {
  override name = "MalformedAddress";
  readonly address: string;
  constructor(address: string, problem: string) {
    super(`address ${JSON.stringify(address)} is not host:port: ${problem}`);
    this.address = address;
  }
}

function check(address: string): Address | string {
  const colon = address.lastIndexOf(":");
  if (colon < 0) return "no port";
  if (colon === 0) return "no host";
  const digits = address.slice(colon + 1);
  if (!/^\d+$/.test(digits)) return `port ${JSON.stringify(digits)} is not a number`;
  const port = Number(digits);
  if (port < 1 || port > 65_535) return `port ${port} is outside 1-65535`;
  return { host: address.slice(0, colon), port };
}

/**
 * `"host:port"` -> `{ host, port }`: the host is everything before the last colon (no caller
 * takes IPv6: `addressSchema` allows no colon in a host), the port an integer in 1-65535.
 * Throws `MalformedAddress` otherwise.
 */
export function parseAddress(address: string): Address {
  const parsed = check(address);
  if (typeof parsed === "string") throw new MalformedAddress(address, parsed);
  return parsed;
}

/** `parseAddress` for an address from outside (a client's view of the topology): undefined when malformed. */
export function tryParseAddress(address: string): Address | undefined {
  const parsed = check(address);
  return typeof parsed === "string" ? undefined : parsed;
}
