// Builds dist/esm (ES modules) and dist/cjs (CommonJS, marked by its own package.json), each with
// its .d.ts files; then the tests and examples into build/ (ESM) for `node --test`.
import { execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs";

const tsc = (project) => execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", project], { stdio: "inherit" });
rmSync("dist", { recursive: true, force: true });
rmSync("build", { recursive: true, force: true });
tsc("tsconfig.build.json");
tsc("tsconfig.cjs.json");
mkdirSync("dist/cjs", { recursive: true });
writeFileSync("dist/cjs/package.json", JSON.stringify({ type: "commonjs" }) + "\n");
chmodSync("dist/esm/driver.js", 0o755);
tsc("tsconfig.json");
