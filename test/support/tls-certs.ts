import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { RedisTlsFiles } from "../../src/dev/local-stack/redis-nodes.ts";

/** A certificate and its key, PEM files. */
export interface CertPair {
  readonly certFile: string;
  readonly keyFile: string;
}

/**
 * Certificates made with `openssl` at test time in `<temp dir>/tls` (never in the repo), laid out
 * as docs/agent.md's `/etc/shardguard/tls` (`ca.crt`, `agent.crt`, `agent.key`): a CA, one
 * certificate per node (127.0.0.1 and localhost, no key-usage limits, so a node shows it to
 * clients and to its primary alike), the agent's client certificate, an expired one and a second,
 * unrelated CA.
 */
export class TestCertificates {
  /** The temp dir; the certificates are in its `tls` subdirectory. */
  readonly dir: string;
  readonly tlsDir: string;
  readonly caFile: string;
  /** A CA that signed nothing the nodes serve: the "wrong CA" case. */
  readonly otherCaFile: string;
  readonly agent: CertPair;
  /** Signed by the right CA, valid until yesterday. */
  readonly expiredAgent: CertPair;
  readonly #caKey: string;
  readonly #sans: string;

  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), "shardguard-tls-"));
    this.tlsDir = join(this.dir, "tls");
    mkdirSync(this.tlsDir);
    this.caFile = join(this.tlsDir, "ca.crt");
    this.#caKey = join(this.tlsDir, "ca.key");
    this.#sans = join(this.tlsDir, "san.cnf");
    writeFileSync(this.#sans, "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
    this.#selfSigned("shardguard-test-ca", this.caFile, this.#caKey);
    this.otherCaFile = join(this.tlsDir, "other-ca.crt");
    this.#selfSigned("someone-else-ca", this.otherCaFile, join(this.tlsDir, "other-ca.key"));
    this.agent = this.issue("agent", 2);
    this.expiredAgent = this.issue("expired-agent", -1);
  }

  /** A certificate for `name` signed by the CA, valid for `days` (negative: expired). */
  issue(name: string, days: number): CertPair {
    const certFile = join(this.tlsDir, `${name}.crt`);
    const keyFile = join(this.tlsDir, `${name}.key`);
    const csr = join(this.tlsDir, `${name}.csr`);
    openssl("req", "-new", "-nodes", ...EC, "-keyout", keyFile, "-out", csr, "-subj", `/CN=${name}`);
    openssl(
      "x509",
      "-req",
      "-in",
      csr,
      "-CA",
      this.caFile,
      "-CAkey",
      this.#caKey,
      "-CAcreateserial",
      "-days",
      String(days),
      "-extfile",
      this.#sans,
      "-out",
      certFile,
    );
    return { certFile, keyFile };
  }

  /** Per-node files for `RedisSecurity.tls`: each node its own certificate, issued on first use. */
  readonly nodeFiles = (() => {
    const issued = new Map<string, RedisTlsFiles>();
    return (id: string): RedisTlsFiles => {
      let files = issued.get(id);
      if (!files) {
        files = { caFile: this.caFile, ...this.issue(id, 2) };
        issued.set(id, files);
      }
      return files;
    };
  })();

  #selfSigned(name: string, certFile: string, keyFile: string): void {
    openssl(
      "req",
      "-x509",
      "-new",
      "-nodes",
      ...EC,
      "-keyout",
      keyFile,
      "-out",
      certFile,
      "-days",
      "2",
      "-subj",
      `/CN=${name}`,
    );
  }

  destroy(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { stdio: ["ignore", "ignore", "pipe"] });
}
