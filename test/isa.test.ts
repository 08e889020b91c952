/** The AVX2 and scalar kernels agree with the default (AVX-512 where present) within fp32 tolerance. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { ROOT, tempDir } from "./helpers.js";

function logitsWith(isa: string | undefined): { isa: string; logits: Float32Array } {
  const file = path.join(tempDir(), "logits.bin");
  const env = { ...process.env };
  if (isa) env.WEFT_ISA = isa;
  else delete env.WEFT_ISA;
  const used = execFileSync(process.execPath, [path.join(ROOT, "dist", "test", "support", "dump-logits.js"), file], { env }).toString();
  const b = fs.readFileSync(file);
  return { isa: used, logits: new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4) };
}

test("forced AVX2 and scalar paths agree with the default path", () => {
  const base = logitsWith(undefined);
  for (const isa of ["avx2", "scalar"]) {
    if (isa === base.isa) {
      console.log(`NOTICE: this host has no AVX-512, so the default path is ${isa}: ${isa} is not compared with itself (only the scalar path is checked)`);
      continue;
    }
    const other = logitsWith(isa);
    assert.equal(other.isa, isa);
    let maxDiff = 0, scale = 0;
    other.logits.forEach((v, i) => {
      maxDiff = Math.max(maxDiff, Math.abs(v - base.logits[i]!));
      scale = Math.max(scale, Math.abs(base.logits[i]!));
    });
    console.log(`${isa} vs ${base.isa}: max |Δlogit| ${maxDiff.toExponential(3)} (logit scale ${scale.toFixed(3)})`);
    assert.ok(maxDiff / scale < 1e-5, `${isa} differs by ${maxDiff}`);
  }
});

test("an unknown WEFT_ISA is refused with a clear error", () => {
  assert.throws(() => logitsWith("avx9000"), /WEFT_ISA must be avx512, avx2 or scalar/);
});
