// Build: dist/node-worker.js (Node host), dist/browser/ (page host), dist/test/*.test.js.
import { build } from "esbuild";
import { cpSync, mkdirSync, readdirSync, rmSync } from "node:fs";

rmSync("dist", { recursive: true, force: true });
mkdirSync("dist/browser", { recursive: true });
const common = {
  bundle: true,
  format: "esm",
  target: "es2022",
  sourcemap: true,
  logLevel: "warning",
};
await build({
  ...common,
  entryPoints: ["src/node-host.ts"],
  outfile: "dist/node-worker.js",
  platform: "node",
  external: ["webgpu"],
  banner: { js: "#!/usr/bin/env node" },
});
await build({
  ...common,
  entryPoints: ["src/browser-host.ts"],
  outfile: "dist/browser/worker.js",
  platform: "browser",
});
cpSync("src/browser/index.html", "dist/browser/index.html");
const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts"));
await build({
  ...common,
  entryPoints: tests.map((f) => `test/${f}`),
  outdir: "dist/test",
  platform: "node",
  packages: "external",
});
