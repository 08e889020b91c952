/** Benchmark prompts: synthetic token ids of fixed lengths (with an optional shared prefix), or a built-in text set. */

export interface WorkloadOptions {
  numPrompts: number;
  /** Tokens per prompt; absent → the built-in prompt set. */
  promptLen?: number;
  /** Tokens shared by every prompt at its start (prefix-cache workloads). */
  prefixLen?: number;
  vocab: number;
  seed?: number;
}

/** Sixteen prompts of varied lengths, for runs that give no lengths. */
export const BUILTIN_PROMPTS = [
  "Hello!",
  "What is the capital of France?",
  "Write a haiku about the sea.",
  "Explain in one paragraph why the sky is blue.",
  "List five prime numbers and say what makes a number prime.",
  "Translate into German: The weather is lovely today and we are going for a walk in the park.",
  "Summarise the plot of Romeo and Juliet in three sentences, naming the two families involved.",
  "You are a helpful assistant. A user asks how to boil an egg so that the yolk stays soft. Give clear steps with timings.",
  "Write a short Python function that returns the n-th Fibonacci number iteratively, and explain its time complexity.",
  "Compare TCP and UDP: how each handles ordering, reliability and congestion, and name one application that suits each.",
  "Draft a polite email to a colleague asking to move our Thursday meeting to Friday afternoon because of a customer visit.",
  "In a few sentences, describe how a paged KV cache lets an inference server batch many requests of different lengths without wasting memory.",
  "A train leaves at 9:40 and arrives at 13:05. Another leaves at 10:15 and takes 20 minutes less. When does the second arrive? Show the working.",
  "Give a recipe for a vegetarian lasagne for four people: the ingredients with quantities, then the steps, then how long to bake it and at what temperature.",
  "Explain the difference between supervised, unsupervised and reinforcement learning, with one concrete example of each drawn from everyday products.",
  "Write the opening paragraph of a mystery novel set in a lighthouse during a winter storm, introducing the keeper, a stranger at the door, and a missing logbook.",
];

/** A seeded xorshift generator of numbers in [0, 1): the same workload on every run. */
export function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return (s >>> 0) / 2 ** 32;
  };
}

/** Token-id prompts: `numPrompts` of `promptLen` tokens, the first `prefixLen` shared. */
export function syntheticPrompts(o: WorkloadOptions & { promptLen: number }): number[][] {
  const r = rng(o.seed ?? 1);
  const token = (): number => 100 + Math.floor(r() * Math.min(o.vocab - 100, 100000));
  const prefix = Array.from({ length: Math.min(o.prefixLen ?? 0, o.promptLen - 1) }, token);
  return Array.from({ length: o.numPrompts }, () => [...prefix, ...Array.from({ length: o.promptLen - prefix.length }, token)]);
}

/** The built-in prompts, cycled to `numPrompts`, tokenized by `encode`. */
export function builtinPrompts(numPrompts: number, encode: (text: string) => number[]): number[][] {
  return Array.from({ length: numPrompts }, (_, i) => encode(BUILTIN_PROMPTS[i % BUILTIN_PROMPTS.length]!));
}
