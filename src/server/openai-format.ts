/**
 * Engine outputs → OpenAI response objects: whole bodies, stream chunks,
 * log-probs and usage. Usage sums are defined here once.
 */
import { randomBytes } from "node:crypto";
import type { LoadedModel } from "../engine/engine-manager.js";
import type { RequestOutput } from "../engine/output-stream.js";
import type { GeneratedLogprob } from "../engine/request.js";
import type { PromptScore } from "../runtime/model-runner.js";
import { apiError, type ApiError } from "./errors.js";
import type { Choice, GenerationRequest } from "./engine-requests.js";
import { ChatOutput, type ChatOutputSpec, type ChatPiece, type ToolCall } from "./chat-output.js";

type Json = Record<string, unknown>;

export function newId(prefix: string): string {
  return `${prefix}-${randomBytes(12).toString("hex")}`;
}

export interface UsageTotals {
  promptTokens: number;
  completionTokens: number;
  cachedTokens: number;
}

/** Prompt tokens once per prompt; completion and cached tokens summed over every choice's output. */
export function usageTotals(prompts: readonly number[][], outs: readonly RequestOutput[], n: number): UsageTotals {
  const completionTokens = outs.reduce((s, o) => s + (o.usage?.completionTokens ?? 0), 0);
  // Each prompt is counted once however many choices share it; its cached tokens likewise (the first choice's).
  const cachedTokens = outs.reduce((s, o, i) => s + (i % n === 0 ? o.usage?.cachedTokens ?? 0 : 0), 0);
  return { promptTokens: prompts.reduce((s, p) => s + p.length, 0), completionTokens, cachedTokens };
}

export function usageBody(u: UsageTotals): Json {
  return {
    prompt_tokens: u.promptTokens, completion_tokens: u.completionTokens, total_tokens: u.promptTokens + u.completionTokens,
    prompt_tokens_details: { cached_tokens: u.cachedTokens },
  };
}

/** The one mapping from a failed choice to the error the client sees, streamed or not. */
export function failureError(failed: RequestOutput, requestId: string): ApiError {
  return failed.errorKind === "shutdown" ? apiError("shutting_down", {}) : apiError("generation_failed", { requestId });
}

function tokenText(model: LoadedModel, id: number): string {
  return model.tokenizer ? model.tokenizer.tokenText(id) : String(id);
}

export function chatLogprobs(model: LoadedModel, lps: GeneratedLogprob[], top: number): Json {
  const entry = (id: number, logprob: number): { token: string; logprob: number; bytes: number[] } => {
    const token = tokenText(model, id);
    return { token, logprob, bytes: [...Buffer.from(token, "utf8")] };
  };
  return { content: lps.map((lp) => ({ ...entry(lp.tokenId, lp.logprob), top_logprobs: lp.top.slice(0, top).map((t) => entry(t.tokenId, t.logprob)) })) };
}

/** Legacy completions' log-probs: parallel lists, one entry per token. */
export interface LegacyLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

/** Each token's text and its offset, counted from `offset`. */
function offsetsOf(model: LoadedModel, ids: readonly number[], offset: number): { tokens: string[]; text_offset: number[] } {
  const tokens = ids.map((id) => tokenText(model, id));
  const text_offset: number[] = [];
  let at = offset;
  for (const t of tokens) {
    text_offset.push(at);
    at += t.length;
  }
  return { tokens, text_offset };
}

const topDict = (model: LoadedModel, top: readonly { tokenId: number; logprob: number }[], n: number): Record<string, number> =>
  Object.fromEntries(top.slice(0, n).map((t) => [tokenText(model, t.tokenId), t.logprob]));

export function completionLogprobs(model: LoadedModel, lps: GeneratedLogprob[], top: number, offset: number): LegacyLogprobs {
  return {
    ...offsetsOf(model, lps.map((lp) => lp.tokenId), offset),
    token_logprobs: lps.map((lp) => lp.logprob),
    top_logprobs: lps.map((lp) => topDict(model, lp.top, top)),
  };
}

/**
 * An echoed prompt's log-probs, as OpenAI's legacy completions and vLLM give
 * them: the first token has none (null); offsets count from the prompt's start.
 */
export function echoedLogprobs(model: LoadedModel, prompt: readonly number[], scores: readonly (PromptScore | null)[], top: number): LegacyLogprobs {
  return {
    ...offsetsOf(model, prompt, 0),
    token_logprobs: scores.map((s) => s?.logprob ?? null),
    top_logprobs: scores.map((s) => (s ? topDict(model, s.top, top) : null)),
  };
}

function joinLogprobs(a: LegacyLogprobs, b: LegacyLogprobs): LegacyLogprobs {
  return {
    tokens: [...a.tokens, ...b.tokens], token_logprobs: [...a.token_logprobs, ...b.token_logprobs],
    top_logprobs: [...a.top_logprobs, ...b.top_logprobs], text_offset: [...a.text_offset, ...b.text_offset],
  };
}

/**
 * vLLM's prompt_logprobs: null for the first token, then per position a map from
 * token id to {logprob, rank, decoded_token}: the prompt's token, then the top `n`.
 */
export function promptLogprobsBody(model: LoadedModel, scores: readonly (PromptScore | null)[], n: number): (Json | null)[] {
  const entry = (id: number, logprob: number, rank: number): [string, Json] => [String(id), { logprob, rank, decoded_token: tokenText(model, id) }];
  return scores.map((s) => {
    if (!s) return null;
    const top = s.top.slice(0, n).map((t, i) => entry(t.tokenId, t.logprob, i + 1)).filter(([id]) => id !== String(s.tokenId));
    return Object.fromEntries([entry(s.tokenId, s.logprob, s.rank), ...top]);
  });
}

/** An echoed prompt's text: as sent, or decoded from its token ids. */
export function promptText(model: LoadedModel, r: GenerationRequest, ids: number[], i: number): string {
  const original = r.kind === "completion" ? r.prompts[i] : undefined;
  return typeof original === "string" ? original : model.tokenizer?.decode(ids, false) ?? "";
}

/** Fields every response object and chunk shares. */
export interface ResponseHeader {
  id: string;
  created: number;
  model: string;
}

export function responseHeader(r: GenerationRequest, model: string): ResponseHeader {
  return { id: newId(r.kind === "chat" ? "chatcmpl" : "cmpl"), created: Math.floor(Date.now() / 1000), model };
}

/** A chat choice's finish_reason: "tool_calls" when it stopped (not cut) with calls. */
function chatFinishReason(o: RequestOutput, calls: readonly ToolCall[]): string | undefined {
  return calls.length > 0 && o.finishReason === "stop" ? "tool_calls" : o.finishReason;
}

/** The assistant message of a whole chat answer; without a parse spec the text is the content. */
function chatMessage(text: string, spec: ChatOutputSpec | null, cut: boolean): { message: Json; calls: ToolCall[] } {
  if (!spec) return { message: { role: "assistant", content: text }, calls: [] };
  const p = ChatOutput.parse(spec, text, cut);
  const message: Json = { role: "assistant", content: p.toolCalls.length > 0 && p.content.trim() === "" ? null : p.content };
  if (spec.reasoning) message.reasoning_content = p.reasoning === "" ? null : p.reasoning;
  if (p.toolCalls.length > 0) message.tool_calls = p.toolCalls;
  return { message, calls: p.toolCalls };
}

/** A non-streamed response body; `spec` parses chat answers (reasoning, tool calls). */
export function wholeBody(r: GenerationRequest, h: ResponseHeader, model: LoadedModel, prompts: number[][], choices: Choice[], outs: RequestOutput[],
  spec: ChatOutputSpec | null = null): Json {
  const body: Json = { id: h.id, object: r.kind === "chat" ? "chat.completion" : "text_completion", created: h.created, model: h.model };
  body.choices = choices.map((c, i) => {
    const o = outs[i]!;
    const choice: Json = { index: c.index };
    if (r.kind === "chat") {
      const { message, calls } = chatMessage(o.text, spec, o.finishReason === "length");
      choice.message = message;
      choice.logprobs = r.logprobs !== null ? chatLogprobs(model, o.logprobs, r.logprobs) : null;
      choice.finish_reason = chatFinishReason(o, calls);
    } else {
      const prefix = r.echo ? promptText(model, r, prompts[c.promptIndex]!, c.promptIndex) : "";
      choice.text = prefix + o.text;
      const generated = r.logprobs !== null ? completionLogprobs(model, o.logprobs, r.logprobs, prefix.length) : null;
      const echoed = generated && r.echo && o.promptLogprobs ? echoedLogprobs(model, prompts[c.promptIndex]!, o.promptLogprobs, r.logprobs!) : null;
      choice.logprobs = echoed && generated ? joinLogprobs(echoed, generated) : generated;
      choice.finish_reason = o.finishReason;
      if (r.promptLogprobs !== null) choice.prompt_logprobs = promptLogprobsBody(model, o.promptLogprobs ?? [], r.promptLogprobs);
    }
    choice.stop_reason = o.stopReason ?? null;
    if (r.returnTokenIds) choice.token_ids = o.tokenIds;
    return choice;
  });
  if (r.kind === "chat" && r.promptLogprobs !== null) body.prompt_logprobs = promptLogprobsBody(model, outs[0]?.promptLogprobs ?? [], r.promptLogprobs);
  body.usage = usageBody(usageTotals(prompts, outs, r.n));
  if (r.returnTokenIds) body.prompt_token_ids = prompts.length === 1 ? prompts[0] : prompts;
  return body;
}

/** Builds a stream's chunks; `spec` parses chat answers (reasoning, tool calls), one parser per choice. */
export class ChunkFormatter {
  private readonly object: string;
  private readonly outputs = new Map<number, ChatOutput>();
  /** Completions' echo: each choice's prompt (its text, and ids for its log-probs). */
  private readonly echoes = new Map<number, { text: string; ids: number[] }>();

  constructor(
    private readonly r: GenerationRequest,
    private readonly h: ResponseHeader,
    private readonly model: LoadedModel,
    private readonly spec: ChatOutputSpec | null = null,
  ) {
    this.object = r.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  }

  chunk(choices: unknown[]): Json {
    return { id: this.h.id, object: this.object, created: this.h.created, model: this.h.model, choices, ...(this.r.includeUsage ? { usage: null } : {}) };
  }

  /** The opening chunk of a choice (chat: the role; completions: the echoed prompt), or null. */
  opening(c: Choice, prompts: number[][]): Json | null {
    if (this.r.kind === "chat") return this.chunk([{ index: c.index, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }]);
    if (!this.r.echo) return null;
    const echo = { text: promptText(this.model, this.r, prompts[c.promptIndex]!, c.promptIndex), ids: prompts[c.promptIndex]! };
    this.echoes.set(c.index, echo);
    // With log-probs the prompt goes out with its log-probs, in the first output's chunk.
    if (this.r.logprobs !== null) return null;
    return this.chunk([{ index: c.index, text: echo.text, logprobs: null, finish_reason: null }]);
  }

  /** The chunks for one output of a choice (none when there is nothing to send); `textOffset` is the choice's text so far. */
  deltas(c: Choice, o: RequestOutput, textOffset: number): Json[] {
    const r = this.r;
    if (r.kind === "chat") return this.chatDeltas(c, o);
    const finishReason = o.finished ? o.finishReason : null;
    const echo = this.echoes.get(c.index);
    const echoNow = echo && r.logprobs !== null && o.promptLogprobs ? echo : null;
    if (!o.text && !finishReason && !echoNow && !(r.logprobs !== null && o.logprobs.length)) return [];
    // Generated text follows the echoed prompt, so its offsets start after it.
    let lp = r.logprobs !== null ? completionLogprobs(this.model, o.logprobs, r.logprobs, (echo?.text.length ?? 0) + textOffset) : null;
    if (lp && echoNow) lp = joinLogprobs(echoedLogprobs(this.model, echoNow.ids, o.promptLogprobs!, r.logprobs!), lp);
    const text = (echoNow?.text ?? "") + o.text;
    return [this.chunk([{ index: c.index, text, logprobs: lp, finish_reason: finishReason, ...this.extra(o) }])];
  }

  private extra(o: RequestOutput): Json {
    return { ...(this.r.returnTokenIds ? { token_ids: o.tokenIds } : {}), ...(o.finished ? { stop_reason: o.stopReason ?? null } : {}) };
  }

  /**
   * Chat: the text split into reasoning and content, and tool calls as OpenAI
   * streams them (a call's index, id and name with empty arguments, then its
   * arguments in pieces), then the finish_reason.
   */
  private chatDeltas(c: Choice, o: RequestOutput): Json[] {
    const r = this.r;
    const { piece, calls } = this.piece(c, o);
    const lp = r.logprobs !== null && o.logprobs.length ? chatLogprobs(this.model, o.logprobs, r.logprobs!) : null;
    const delta: Json = {
      ...(piece.reasoning ? { reasoning_content: piece.reasoning } : {}),
      ...(piece.content ? { content: piece.content } : {}),
    };
    const out: Json[] = [];
    const callChunks = piece.toolCalls.map((d) => this.chunk([{ index: c.index, delta: { tool_calls: [d] }, logprobs: null, finish_reason: null }]));
    const finishReason = o.finished ? chatFinishReason(o, calls) ?? null : null;
    if (Object.keys(delta).length > 0 || lp !== null || (r.returnTokenIds && o.tokenIds.length > 0)) {
      out.push(this.chunk([{ index: c.index, delta, logprobs: lp, finish_reason: null, ...(r.returnTokenIds ? { token_ids: o.tokenIds } : {}) }]));
    }
    out.push(...callChunks);
    if (o.finished) out.push(this.chunk([{ index: c.index, delta: {}, logprobs: null, finish_reason: finishReason, stop_reason: o.stopReason ?? null }]));
    return out;
  }

  /** This output's text through the choice's parser (none: all content); at the end, the answer's calls. */
  private piece(c: Choice, o: RequestOutput): { piece: ChatPiece; calls: readonly ToolCall[] } {
    if (!this.spec) return { piece: { reasoning: "", content: o.text, toolCalls: [] }, calls: [] };
    let parser = this.outputs.get(c.index);
    if (!parser) this.outputs.set(c.index, (parser = new ChatOutput(this.spec)));
    const now = parser.push(o.text);
    if (!o.finished) return { piece: now, calls: [] };
    const end = parser.finish(o.finishReason === "length");
    return { piece: { reasoning: now.reasoning + end.reasoning, content: now.content + end.content, toolCalls: [...now.toolCalls, ...end.toolCalls] }, calls: parser.calls };
  }

  usage(u: UsageTotals): Json {
    return { id: this.h.id, object: this.object, created: this.h.created, model: this.h.model, choices: [], usage: usageBody(u) };
  }
}
