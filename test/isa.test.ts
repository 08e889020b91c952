/** In float32 mode every kernel set agrees with the default: the AVX-512 family bit for bit, AVX2 and scalar within fp32 tolerance. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { ROOT, tempDir } from "./helpers.js";
import { loadNative } from "../src/runtime/native.js";

function logitsWith(isa: string | undefined): { isa: string; logits: Float32Array } {
  const file = path.join(tempDir(), "logits.bin");
  const env = { ...process.env };
  if (isa) env.WEFT_ISA = isa;
  else delete env.WEFT_ISA;
  const used = execFileSync(process.execPath, [path.join(ROOT, "dist", "test", "support", "dump-logits.js"), file], { env }).toString();
  const b = fs.readFileSync(file);
  return { isa: used, logits: new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4) };
}

/** Kernel sets whose fp32 loops are the AVX-512 ones: in float32 mode they must agree bit for bit. */
const AVX512_FAMILY = ["amx", "avx512bf16", "avx512"];
const features = loadNative().cpuFeatures();
const available: Record<string, boolean> = {
  amx: features.amx, avx512bf16: features.avx512bf16, avx512: features.avx512, avx2: features.avx2, scalar: true,
};

test("float32 mode: every forced kernel set agrees with the default one", () => {
  const base = logitsWith(undefined);
  for (const isa of ["amx", "avx512bf16", "avx512", "avx2", "scalar"]) {
    if (!available[isa]) {
      console.log(`NOTICE: this CPU lacks ${isa}: its float32 path is not tested here`);
      continue;
    }
    if (isa === base.isa) continue;
    const other = logitsWith(isa);
    assert.equal(other.isa, isa);
    if (AVX512_FAMILY.includes(isa) && AVX512_FAMILY.includes(base.isa)) {
      assert.equal(Buffer.compare(Buffer.from(other.logits.buffer), Buffer.from(base.logits.buffer)), 0, `${isa} vs ${base.isa}`);
      continue;
    }
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
  assert.throws(() => logitsWith("avx9000"), /WEFT_ISA must be amx, avx512bf16, avx512, avx2 or scalar/);
});
