// The docs' Node code is tested code: every TypeScript or JavaScript block of README.md is a file
// under examples/ printed as is (the examples run here or in invoice.test.ts), and every block in
// the Node sections of docs/clients.md is a file under tests/clients/ printed as is (the
// repository's tests/clients.rs runs those).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, describe, test } from "node:test";

import { repoRoot, Server } from "./kit.js";

const run = promisify(execFile);
const nodeDir = join(repoRoot, "node");

/** The fenced code blocks of a Markdown text in one of these languages. */
function blocks(markdown: string, languages: string[]): string[] {
  const found: string[] = [];
  const fence = /^```(\w*)\n([\s\S]*?)^```$/gm;
  for (let match = fence.exec(markdown); match !== null; match = fence.exec(markdown)) {
    if (languages.includes(match[1] ?? "")) found.push(match[2] ?? "");
  }
  return found;
}

/** The files of dir whose name ends with one of the extensions, by content. */
function files(dir: string, extensions: string[]): Map<string, string> {
  const named = new Map<string, string>();
  for (const name of readdirSync(dir).filter((n) => extensions.some((e) => n.endsWith(e))).sort()) {
    named.set(readFileSync(join(dir, name), "utf8"), name);
  }
  return named;
}

test("every code block of node/README.md is a file under node/examples, printed as is", () => {
  const readme = readFileSync(join(nodeDir, "README.md"), "utf8");
  const examples = files(join(nodeDir, "examples"), [".ts"]);
  const printed = new Set<string>();
  const code = blocks(readme, ["ts", "typescript", "js", "javascript", "mjs", "cjs"]);
  assert.ok(code.length >= 3, `${String(code.length)} blocks`);
  for (const block of code) {
    const file = examples.get(block);
    assert.ok(file !== undefined, `README.md prints a block that is no file under node/examples:\n${block}`);
    printed.add(file);
  }
  // The blocks other than code: the install commands only.
  assert.deepEqual(
    blocks(readme, ["sh"]).map((b) => b.split("\n")[0]),
    ["(cd ../dlock/node && npm ci && npm run build && npm pack)"],
  );
  assert.deepEqual([...printed].sort(), ["invoice.ts", "quickstart.ts", "redlock.ts", "transfer.ts"]);
});

test("every code block in the Node sections of docs/clients.md is a file under tests/clients, printed as is", () => {
  const page = readFileSync(join(repoRoot, "docs", "clients.md"), "utf8");
  const sections = page.split(/^(?=## )/m).filter((section) => section.startsWith("## Node"));
  assert.ok(sections.length >= 3, `${String(sections.length)} Node sections`);
  const snippets = files(join(repoRoot, "tests", "clients"), [".cjs", ".js", ".mjs", ".ts"]);
  let count = 0;
  for (const section of sections) {
    for (const block of blocks(section, ["js", "javascript", "ts", "typescript", "cjs", "mjs"])) {
      count++;
      assert.ok(snippets.has(block), `docs/clients.md prints a Node block that is no file under tests/clients:\n${block}`);
    }
    assert.deepEqual(blocks(section, ["", "sh", "bash"]).length, 0, "a Node section's block with another language");
  }
  assert.ok(count >= 4, `${String(count)} Node blocks`);
});

describe("the README's examples run", { timeout: 30_000 }, () => {
  let server: Server;
  before(async () => {
    server = await Server.start();
  });
  after(() => {
    server.stop();
  });
  const example = async (name: string): Promise<string> => {
    const { stdout } = await run(process.execPath, [join(nodeDir, "build", "examples", name)], { env: { ...process.env, REDIS_URL: server.url } });
    return stdout;
  };

  test("examples/quickstart.ts: a fenced write under the lease, then a body under it", async () => {
    assert.match(await example("quickstart.js"), /^paid under fence \d+\nstatus: paid\n$/);
  });

  test("examples/transfer.ts: two accounts held as one set, each write under its own fence", async () => {
    assert.match(await example("transfer.js"), /^moved 30 under fences (\d+), (\d+)\nbalances: 70, 30\n$/);
    const admin = server.ioredis();
    try {
      assert.equal(await admin.exists("{acct}:alice", "{acct}:bob"), 0);
    } finally {
      admin.disconnect();
    }
  });

  test("examples/redlock.ts: node-redlock's calls, on dlock", async () => {
    assert.match(await example("redlock.js"), /^fence \d+, sent 2\n$/);
    const admin = server.ioredis();
    try {
      assert.equal(await admin.get("report:owner"), "me");
      assert.equal(await admin.call("DLOCK.INFO", "report"), null);
    } finally {
      admin.disconnect();
    }
  });
});
