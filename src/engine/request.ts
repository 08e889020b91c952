/** A generation request and its lifecycle. */
import type { SamplingParams } from "./sampling-params.js";
import type { PromptScore, TokenLogprob } from "../runtime/model-runner.js";
import type { Grammar, RequestGrammar } from "./grammar.js";

/** Ordered: every status after RUNNING is final. */
export enum RequestStatus {
  WAITING = 0,
  RUNNING = 1,
  PREEMPTED = 2,
  FINISHED_STOPPED = 3,
  FINISHED_LENGTH = 4,
  FINISHED_ABORTED = 5,
  FINISHED_ERROR = 6,
}

export type FinishReason = "stop" | "length" | "abort" | "error";

export function isFinished(s: RequestStatus): boolean {
  return s >= RequestStatus.FINISHED_STOPPED;
}

/** OpenAI's finish_reason for a final status. */
export function finishReason(s: RequestStatus): FinishReason | null {
  switch (s) {
    case RequestStatus.FINISHED_STOPPED: return "stop";
    case RequestStatus.FINISHED_LENGTH: return "length";
    case RequestStatus.FINISHED_ABORTED: return "abort";
    case RequestStatus.FINISHED_ERROR: return "error";
    default: return null;
  }
}

/** Why a request stopped with finish_reason "stop": a stop token (EOS or stop_token_ids) or a stop string. */
export type StopReason = { kind: "token"; tokenId: number; eos: boolean } | { kind: "string"; stop: string };

export enum Priority {
  HIGH = 0,
  NORMAL = 1,
  LOW = 2,
}

export interface GeneratedLogprob extends TokenLogprob {
  top: TokenLogprob[];
}

/** What the caller hands to Engine.add. */
export interface RequestInput {
  id?: string;
  promptTokenIds: number[];
  params: SamplingParams;
  priority?: Priority;
  /** Tenant: the prefix-cache salt unless `cacheSalt` is given. */
  tenant?: string;
  cacheSalt?: string;
  /** Structured output: the grammar its tokens must follow. */
  grammar?: Grammar;
}

export class Request {
  status = RequestStatus.WAITING;
  readonly outputTokenIds: number[] = [];
  readonly logprobs: GeneratedLogprob[] = [];
  numComputedTokens = 0;
  /** Prompt tokens served from the prefix cache at admission. */
  numCachedTokens = 0;
  numPreemptions = 0;
  firstTokenTime: number | null = null;
  lastTokenTime: number | null = null;
  scheduledTime: number | null = null;
  /** Its prompt chunk was left out of a step that computed a better request's first token (once only). */
  promptDeferred = false;
  /** Set with FINISHED_STOPPED by whoever decided the stop (the scheduler, or the engine for stop strings). */
  stopReason: StopReason | null = null;
  error: string | null = null;
  errorKind: "shutdown" | "internal" = "internal";
  /** Structured output: its grammar, and its matcher from its first sampled step on (disposed when it ends). */
  grammar: Grammar | null = null;
  matcher: RequestGrammar | null = null;
  /** A stop token has completed the grammar. */
  grammarDone = false;
  /** Prompt log-probs (params.promptLogprobs): entry i scores prompt token i + 1, filled as prefill chunks run. */
  readonly promptScores: PromptScore[] = [];

  constructor(
    readonly id: string,
    readonly promptTokenIds: readonly number[],
    readonly params: SamplingParams,
    readonly priority: Priority,
    readonly tenant: string,
    readonly cacheSalt: string,
    /** Seconds on the engine's clock. */
    readonly arrivalTime: number,
    /** Tie-breaker: admission order. */
    readonly sequence: number,
  ) {}

  get allTokenIds(): number[] {
    return [...this.promptTokenIds, ...this.outputTokenIds];
  }

  /** Tokens [from, to) of prompt + output, without copying the whole sequence (a decode step takes one). */
  tokenSlice(from: number, to: number): number[] {
    const n = this.promptTokenIds.length;
    if (from >= n) return this.outputTokenIds.slice(from - n, to - n);
    if (to <= n) return this.promptTokenIds.slice(from, to);
    return [...this.promptTokenIds.slice(from), ...this.outputTokenIds.slice(0, to - n)];
  }

  /** Tokens it may take (prompt + max_tokens): its cost to its tenant's fair share. */
  get fairShareCost(): number {
    return this.promptTokenIds.length + this.params.maxTokens;
  }

  /** This step's prompt rows to score, as the runner takes them: positions not scored yet whose next token is in the prompt. */
  scoreSpan(numTokens: number): { firstRow: number; targets: number[]; topN: number } | undefined {
    const topN = this.params.promptLogprobs;
    if (topN === null) return undefined;
    const start = this.numComputedTokens;
    const first = Math.max(start, this.promptScores.length);
    const end = Math.min(start + numTokens, this.promptTokenIds.length - 1);
    if (end <= first) return undefined;
    return { firstRow: first - start, targets: this.promptTokenIds.slice(first + 1, end + 1), topN };
  }

  get numTokens(): number {
    return this.promptTokenIds.length + this.outputTokenIds.length;
  }
}
