/** A runner without a model: deterministic tokens, and a record of every step's work. */
import type { Runner } from "../../src/engine/engine.js";
import type { RunnerSequence, StepResult } from "../../src/runtime/model-runner.js";

export class FakeRunner implements Runner {
  readonly steps: RunnerSequence[][] = [];
  tokensComputed = 0;

  constructor(private readonly vocab = 1000) {}

  execute(seqs: readonly RunnerSequence[]): Promise<StepResult> {
    this.steps.push([...seqs]);
    this.tokensComputed += seqs.reduce((n, s) => n + s.tokenIds.length, 0);
    // The next token depends only on the sequence's position and last token: any schedule yields the same output.
    const samples = seqs.map((s) =>
      s.sample ? { tokenId: (s.tokenIds.at(-1)! * 31 + s.startPosition + s.tokenIds.length) % this.vocab, logprob: -1, top: [] } : null);
    return new Promise((resolve) => setImmediate(() => resolve({ samples, errors: seqs.map(() => null) })));
  }
}
