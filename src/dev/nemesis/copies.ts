/**
 * Guarantee 1 (shared/DESIGN.md) keeps a replica-acknowledged write through the loss of one copy:
 * `WAIT 1` puts it on the primary and on one replica. A kill -9 of redis destroys its process's
 * copy (restarted empty, from an RDB up to 2 s old, or not at all), so the nemesis injects one only
 * while another node is an intact copy: the topology's primary answering as a master, or a replica
 * linked to it. Two copies destroyed together lose writes that no failover system can keep; that
 * is out of the fault model, and `restart-from-rdb.test.ts` covers what the controller does then.
 */

/** What one node's `ROLE` answered; undefined when it did not answer (down, paused, restarting). */
export type RoleRead =
  | { readonly role: "master" }
  | { readonly role: "slave"; readonly following: string | undefined; readonly linkUp: boolean };

/** The node ids, other than `target`, that hold the shard's data intact now. */
export function intactCopies(
  target: string,
  roles: ReadonlyMap<string, RoleRead | undefined>,
  primary: string | undefined,
): string[] {
  if (primary === undefined) return [];
  const intact: string[] = [];
  for (const [id, read] of roles) {
    if (id === target || read === undefined) continue;
    const holds =
      read.role === "master" ? id === primary : read.linkUp && read.following === primary && id !== primary;
    if (holds) intact.push(id);
  }
  return intact.sort();
}
