/** Rope inverse frequencies, the one piece of the forward pass computed in TypeScript (once per model). */

export type RopeScaling =
  | { type: "default" }
  | { type: "llama3"; factor: number; lowFreqFactor: number; highFreqFactor: number; originalMaxPositions: number };

/** (headDim / 2) inverse frequencies in fp32, as transformers computes them, with llama3 scaling applied. */
export function ropeInvFreq(headDim: number, theta: number, scaling: RopeScaling): Float32Array {
  const half = headDim / 2;
  const out = new Float32Array(half);
  for (let i = 0; i < half; i++) {
    const exponent = Math.fround((2 * i) / headDim);
    out[i] = Math.fround(1 / Math.fround(Math.pow(theta, exponent)));
  }
  if (scaling.type === "llama3") {
    const s = scaling;
    const lowWavelen = s.originalMaxPositions / s.lowFreqFactor;
    const highWavelen = s.originalMaxPositions / s.highFreqFactor;
    for (let i = 0; i < half; i++) {
      const f = out[i]!;
      const wavelen = (2 * Math.PI) / f;
      if (wavelen > lowWavelen) out[i] = f / s.factor;
      else if (wavelen >= highWavelen) {
        const smooth = (s.originalMaxPositions / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
        out[i] = (1 - smooth) * (f / s.factor) + smooth * f;
      }
    }
  }
  return out;
}
