// The npm pack tarball installs in throwaway projects and imports there, as ES module and as
// CommonJS, with the types first in `exports` (tsc resolves them in both).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, test } from "node:test";

const root = resolve(import.meta.dirname, "..");
const work = mkdtempSync(join(tmpdir(), "dlock-node-pack-"));
after(() => rmSync(work, { recursive: true, force: true }));

const tarball = join(work, execFileSync("npm", ["pack", "--silent", "--pack-destination", work], { cwd: root }).toString().trim().split("\n").pop());

function project(name, type) {
  const dir = join(work, name);
  execFileSync("mkdir", ["-p", dir]);
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name, version: "1.0.0", private: true, type }));
  // Offline: the tarball has no runtime dependencies to fetch.
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--offline", "--omit=peer", tarball], { cwd: dir, stdio: "ignore" });
  return dir;
}

test("ESM: import { Locks, StaleError } from '@dlock/client'", () => {
  const dir = project("esm-user", "module");
  writeFileSync(join(dir, "main.js"), `import { Locks, StaleError, DlockError, keySlot } from "@dlock/client";
import Redlock, { Redlock as Named } from "@dlock/client/redlock";
const e = new StaleError("r", 1, "x");
console.log(typeof Locks, e instanceof DlockError, e.code, keySlot("foo"), typeof Redlock, Redlock === Named);`);
  assert.equal(execFileSync("node", ["main.js"], { cwd: dir }).toString().trim(), "function true ERR_DLOCK_STALE 12182 function true");
});

test("CommonJS: require('@dlock/client')", () => {
  const dir = project("cjs-user", "commonjs");
  writeFileSync(join(dir, "main.js"), `const { Locks, StaleError, DlockError, keySlot } = require("@dlock/client");
const { Redlock } = require("@dlock/client/redlock");
const e = new StaleError("r", 1, "x");
// node-redlock's CommonJS spelling: require("redlock").default
console.log(typeof Locks, e instanceof DlockError, e.code, keySlot("foo"), typeof Redlock, require("@dlock/client/redlock").default === Redlock);`);
  assert.equal(execFileSync("node", ["main.js"], { cwd: dir }).toString().trim(), "function true ERR_DLOCK_STALE 12182 function true");
});

test("the types resolve from both module systems (tsc, NodeNext)", () => {
  const dir = join(work, "esm-user");
  writeFileSync(join(dir, "check.ts"), `import { Locks, type Lease } from "@dlock/client";
import Redlock, { type Lock } from "@dlock/client/redlock";
export async function f(redis: object): Promise<number> { const lease: Lease = await new Locks(redis).hold("x"); return lease.fence; }
export async function g(redis: object): Promise<number> { const lock: Lock = await new Redlock([redis], { retryCount: 0 }).acquire(["x"], 5000); return lock.fence; }`);
  writeFileSync(join(dir, "check.cts"), `import dlock = require("@dlock/client");
export const fence: (l: dlock.Lease) => number = (l) => l.fence;`);
  execFileSync(process.execPath, [join(root, "node_modules/typescript/bin/tsc"), "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--skipLibCheck", "--types", "node", "--typeRoots", join(root, "node_modules/@types"), "check.ts", "check.cts"], { cwd: dir, stdio: "inherit" });
});
