/**
 * The addon's RMSNorm with weight 1, in float32 operation by operation (`inverseRms` and `rmsnorm` in
 * native/matmul.cpp): Σ x² in sixteen lanes (element i into lane i % 16) folded in halves, then
 * x · 1/√(Σ/n + eps). Tests that predict the native logits exactly start from it.
 */
export function nativeRmsnorm(x: Float32Array, eps: number): Float32Array {
  const fr = Math.fround;
  const lane = new Float32Array(16);
  for (const [i, v] of x.entries()) lane[i % 16] = fr(lane[i % 16]! + fr(v * v));
  for (let half = 8; half > 0; half >>= 1) for (let j = 0; j < half; j++) lane[j] = fr(lane[j]! + lane[j + half]!);
  const inv = fr(1 / fr(Math.sqrt(fr(fr(lane[0]! / x.length) + eps))));
  return x.map((v) => fr(v * inv));
}
