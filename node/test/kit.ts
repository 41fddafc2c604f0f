// Real servers for the tests: redis-server (or $DLOCK_SERVER, e.g. a valkey-server) with the
// dlock module on its own port and directory, a Redis Cluster of three primaries, a throwaway
// PostgreSQL. Each has a start-up deadline and is stopped by the test's `after`.

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, chownSync } from "node:fs";
import { createServer, connect, type Server as NetServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

import { Redis, Cluster } from "ioredis";
import { createClient, createCluster } from "redis";

const START_DEADLINE = 20_000;

/** The repository's top directory. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** The module under test: $DLOCK_MODULE, else the newest of target/release and target/debug. */
export function modulePath(): string {
  const given = process.env["DLOCK_MODULE"];
  if (given !== undefined && given !== "") return resolve(given);
  const candidates = ["target/release/libdlock.so", "target/debug/libdlock.so"]
    .map((path) => join(repoRoot, path))
    .filter((path) => existsSync(path))
    .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs);
  const newest = candidates[0];
  if (newest === undefined) throw new Error("libdlock.so not found: run `cargo build -p dlock` or set DLOCK_MODULE");
  return newest;
}

export function serverBinary(): string {
  const binary = process.env["DLOCK_SERVER"];
  return binary !== undefined && binary !== "" ? binary : "redis-server";
}

export function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => {
        done(port);
      });
    });
  });
}

function ping(port: number): Promise<string> {
  return new Promise((done) => {
    const socket = connect(port, "127.0.0.1");
    let data = "";
    socket.setTimeout(1000, () => socket.destroy());
    socket.on("connect", () => socket.write("INFO server\r\n"));
    socket.on("data", (chunk) => {
      data += chunk.toString();
      if (data.includes("process_id:") && data.endsWith("\r\n")) socket.end();
    });
    socket.on("close", () => {
      done(data);
    });
    socket.on("error", () => undefined);
  });
}

/** One running server with the module. */
export class Server {
  private process: ChildProcess | null = null;
  constructor(
    readonly port: number,
    readonly dir: string,
  ) {}
  get url(): string {
    return `redis://127.0.0.1:${String(this.port)}`;
  }
  get addr(): string {
    return `127.0.0.1:${String(this.port)}`;
  }
  static async start(args: string[] = []): Promise<Server> {
    const dir = mkdtempSync(join(tmpdir(), "dlock-node-test-"));
    let last: unknown;
    for (let tries = 0; tries < 5; tries++) {
      const server = new Server(await freePort(), dir);
      try {
        await server.spawn(args);
        return server;
      } catch (error) {
        last = error;
      }
    }
    throw last;
  }
  private async spawn(args: string[]): Promise<void> {
    const child = spawn(
      serverBinary(),
      [
        "--port", String(this.port), "--bind", "127.0.0.1", "--dir", this.dir,
        "--logfile", join(this.dir, "server.log"), "--save", "", "--appendonly", "no",
        "--enable-debug-command", "yes", "--loadmodule", modulePath(), ...args,
      ],
      { stdio: "ignore" },
    );
    this.process = child;
    let exited = false;
    child.once("exit", () => {
      exited = true;
    });
    const deadline = Date.now() + START_DEADLINE;
    while (Date.now() < deadline) {
      if (exited) throw new Error(`${serverBinary()} exited: ${this.log()}`);
      // Another test's server may hold the port: only our own process counts as ready.
      if ((await ping(this.port)).includes(`process_id:${String(child.pid)}\r`)) return;
      await sleep(20);
    }
    child.kill("SIGKILL");
    throw new Error(`${serverBinary()} not ready after ${String(START_DEADLINE)} ms: ${this.log()}`);
  }
  log(): string {
    try {
      return readFileSync(join(this.dir, "server.log"), "utf8");
    } catch {
      return "";
    }
  }
  pause(): void {
    this.process?.kill("SIGSTOP");
  }
  resume(): void {
    this.process?.kill("SIGCONT");
  }
  stop(): void {
    if (this.process !== null) {
      this.process.kill("SIGCONT");
      this.process.kill("SIGKILL");
      this.process = null;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
  /** An ioredis client with ioredis's defaults. */
  ioredis(options: object = {}): Redis {
    return new Redis({ port: this.port, host: "127.0.0.1", ...options });
  }
  /** A connected node-redis client with node-redis's defaults. */
  async nodeRedis(options: { RESP?: 2 | 3 } = {}) {
    const client = createClient({ url: this.url, ...options });
    client.on("error", () => undefined);
    await client.connect();
    return client;
  }
}

/**
 * A TCP proxy in front of a server, to break the links of the clients that connect through it:
 * `dropNextReply` swallows the server's answer to the next request any link sends (the command
 * ran, its reply never arrives) and closes that link; replies on other links (a subscription's,
 * say) pass; `cut` closes every link and stops listening (connections are refused) until `heal`;
 * `rewrite` replaces byte strings on the way (to play an older server).
 */
export class Proxy {
  private readonly links = new Set<Socket>();
  /** Armed by `dropNextReply`, then the link whose next reply is dropped. */
  private dropping: "armed" | Socket | null = null;
  /** Byte strings replaced by others of the same length: [in requests, in replies]. */
  private readonly rewrites: [Buffer, Buffer][][] = [[], []];
  /** How many replacements each direction made so far: [in requests, in replies]. */
  readonly rewritten = [0, 0];
  private listeningOn = 0;
  private constructor(private readonly server: NetServer) {}
  static async start(target: number): Promise<Proxy> {
    const made: { proxy: Proxy | null } = { proxy: null };
    const server = createServer((client) => {
      const proxy = made.proxy;
      if (proxy === null) {
        client.destroy();
        return;
      }
      const upstream = connect(target, "127.0.0.1");
      const close = (): void => {
        client.destroy();
        upstream.destroy();
        proxy.links.delete(client);
        proxy.links.delete(upstream);
      };
      proxy.links.add(client);
      proxy.links.add(upstream);
      client.on("data", (chunk: Buffer) => {
        if (proxy.dropping === "armed") proxy.dropping = client;
        upstream.write(proxy.applyRewrites(chunk, 0));
      });
      upstream.on("data", (chunk: Buffer) => {
        if (proxy.dropping === client) {
          proxy.dropping = null;
          close();
          return;
        }
        client.write(proxy.applyRewrites(chunk, 1));
      });
      for (const socket of [client, upstream]) {
        socket.on("close", close);
        socket.on("error", close);
      }
    });
    made.proxy = new Proxy(server);
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    const address = server.address();
    made.proxy.listeningOn = typeof address === "object" && address !== null ? address.port : 0;
    return made.proxy;
  }
  get port(): number {
    return this.listeningOn;
  }
  dropNextReply(): void {
    this.dropping = "armed";
  }
  /**
   * From now on, every `from` in what clients send (`replies`: in what the server answers)
   * becomes `to`, of the same length. With both directions a test plays an older server: a new
   * option renamed on the way in, the server's complaint about the new name renamed back on the
   * way out. A string split between two reads is not seen (small requests on loopback are read
   * whole).
   */
  rewrite(replies: boolean, from: string, to: string): void {
    const [old, replacement] = [Buffer.from(from), Buffer.from(to)];
    if (old.length !== replacement.length) throw new Error("a rewrite keeps the length");
    this.rewrites[replies ? 1 : 0]?.push([old, replacement]);
  }
  /** @internal chunk with direction's rewrites made (counted). */
  applyRewrites(chunk: Buffer, direction: 0 | 1): Buffer {
    for (const [old, replacement] of this.rewrites[direction] ?? []) {
      let at = chunk.indexOf(old);
      while (at >= 0) {
        replacement.copy(chunk, at);
        this.rewritten[direction] = (this.rewritten[direction] ?? 0) + 1;
        at = chunk.indexOf(old, at + old.length);
      }
    }
    return chunk;
  }
  cut(): void {
    if (this.server.listening) this.server.close();
    for (const socket of this.links) socket.destroy();
    this.links.clear();
  }
  /** Listens again, on the same port. */
  heal(): Promise<void> {
    return new Promise((done, fail) => {
      this.server.once("error", fail);
      this.server.listen(this.listeningOn, "127.0.0.1", () => {
        this.server.off("error", fail);
        done();
      });
    });
  }
  stop(): void {
    this.cut();
  }
}

/** A Redis Cluster of three primaries, the module on each. */
export class TestCluster {
  constructor(readonly nodes: Server[]) {}
  static async start(): Promise<TestCluster> {
    const nodes = await Promise.all(
      [0, 1, 2].map(() =>
        Server.start(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "15000"]),
      ),
    );
    execFileSync("redis-cli", ["--cluster", "create", ...nodes.map((n) => n.addr), "--cluster-replicas", "0", "--cluster-yes"], {
      stdio: "ignore",
    });
    const deadline = Date.now() + 30_000;
    for (const node of nodes) {
      const client = node.ioredis();
      try {
        for (;;) {
          const info = String(await client.call("CLUSTER", "INFO"));
          if (info.includes("cluster_state:ok")) break;
          if (Date.now() > deadline) throw new Error(`cluster not ok on ${node.addr}`);
          await sleep(50);
        }
      } finally {
        client.disconnect();
      }
    }
    return new TestCluster(nodes);
  }
  ioredis(): Cluster {
    return new Cluster(this.nodes.map((n) => ({ host: "127.0.0.1", port: n.port })));
  }
  async nodeRedis() {
    const cluster = createCluster({ rootNodes: this.nodes.map((n) => ({ url: n.url })) });
    cluster.on("error", () => undefined);
    await cluster.connect();
    return cluster;
  }
  stop(): void {
    for (const node of this.nodes) node.stop();
  }
}

/** PostgreSQL's binaries: $DLOCK_PG_BIN, or the newest /usr/lib/postgresql/<version>/bin. */
function pgBin(): string | null {
  const given = process.env["DLOCK_PG_BIN"];
  if (given !== undefined && given !== "") return given;
  if (!existsSync("/usr/lib/postgresql")) return null;
  const versions = readdirSync("/usr/lib/postgresql")
    .filter((v) => /^\d+$/.test(v) && existsSync(`/usr/lib/postgresql/${v}/bin/initdb`))
    .map(Number)
    .sort((a, b) => b - a);
  return versions[0] === undefined ? null : `/usr/lib/postgresql/${String(versions[0])}/bin`;
}

/** A throwaway PostgreSQL on a free loopback port; null without its binaries (unless required). */
export class Postgres {
  private constructor(
    readonly url: string,
    private readonly dir: string,
    private readonly child: ChildProcess,
  ) {}
  static async start(): Promise<Postgres | null> {
    const bin = pgBin();
    if (bin === null) {
      if (process.env["DLOCK_REQUIRE_POSTGRES"] !== undefined) throw new Error("PostgreSQL is required but not installed");
      return null;
    }
    const root = process.getuid?.() === 0;
    const asPostgres = (program: string, args: string[]): [string, string[]] =>
      root ? ["runuser", ["-u", "postgres", "--", program, ...args]] : [program, args];
    const dir = mkdtempSync(join(tmpdir(), "dlock-node-pg-"));
    if (root) {
      const uid = Number(execFileSync("id", ["-u", "postgres"]).toString().trim());
      const gid = Number(execFileSync("id", ["-g", "postgres"]).toString().trim());
      chownSync(dir, uid, gid);
    }
    const data = join(dir, "data");
    const [initdb, initArgs] = asPostgres(join(bin, "initdb"), ["-D", data, "-A", "trust", "-U", "dlock", "--no-sync", "-E", "UTF8", "--locale=C"]);
    execFileSync(initdb, initArgs, { stdio: "ignore" });
    const port = await freePort();
    const [postgres, args] = asPostgres(join(bin, "postgres"), [
      "-D", data, "-p", String(port), "-c", "listen_addresses=127.0.0.1", "-c", `unix_socket_directories=${dir}`,
      "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
    ]);
    const child = spawn(postgres, args, { stdio: "ignore" });
    const pg = new Postgres(`postgres://dlock@127.0.0.1:${String(port)}/postgres`, dir, child);
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      try {
        execFileSync(join(bin, "pg_isready"), ["-h", "127.0.0.1", "-p", String(port), "-U", "dlock"], { stdio: "ignore" });
        return pg;
      } catch {
        await sleep(50);
      }
    }
    pg.stop();
    throw new Error("postgres did not start");
  }
  stop(): void {
    // The child may be runuser: stop the server by its pid file.
    try {
      const pid = Number(readFileSync(join(this.dir, "data", "postmaster.pid"), "utf8").split("\n")[0]);
      process.kill(pid, "SIGINT");
    } catch {
      this.child.kill("SIGKILL");
    }
    setTimeout(() => {
      rmSync(this.dir, { recursive: true, force: true });
    }, 2000).unref();
  }
}
