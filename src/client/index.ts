/**
 * What applications import from the packed package (`import { createPrimaryResolver } from
 * "shardguard/client"`): the primary resolver over the installation's table. Bundled by
 * cdk/build-package.ts with the AWS SDK inlined.
 */
import { createAwsAdapters } from "../adapters/aws-adapters.ts";
import { PrimaryResolver, type PrimaryResolverOptions } from "./primary-resolver.ts";

export {
  endpointOf,
  type PrimaryEndpoint,
  PrimaryResolver,
  type PrimaryResolverOptions,
} from "./primary-resolver.ts";

export interface PrimaryClientOptions extends PrimaryResolverOptions {
  /** The stack's `TableName` output. @default SHARDGUARD_TABLE of `env`, else "shardguard" */
  readonly tableName?: string;
  /** Region, endpoints and credentials as the AWS SDK reads them, and SHARDGUARD_TABLE. @default process.env */
  readonly env?: NodeJS.ProcessEnv;
}

export interface PrimaryClient {
  readonly resolver: PrimaryResolver;
  /** Closes the SDK's sockets. */
  destroy(): void;
}

/**
 * A resolver that reads each shard's topology from the installation's table (one strongly
 * consistent GetItem per refresh: the application's role needs `dynamodb:GetItem` on the table).
 */
export function createPrimaryClient(options: PrimaryClientOptions = {}): PrimaryClient {
  const aws = createAwsAdapters({
    ...(options.env ? { env: options.env } : {}),
    ...(options.tableName ? { tableName: options.tableName } : {}),
  });
  return { resolver: new PrimaryResolver(aws.store.topology, options), destroy: () => aws.destroy() };
}
