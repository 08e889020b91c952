/**
 * A chat choice's text → what the client sees: reasoning (think blocks),
 * content, and tool calls. Reasoning is split first, then the content is
 * searched for tool calls. While streaming, content is sent as it comes until
 * a tool call may begin; from there the calls are sent as OpenAI streams them:
 * a call's index, id and name (with empty arguments) once its name is read,
 * then its arguments in pieces as they are written. At the end the region is
 * parsed whole; text that is not a well-formed call list is content.
 * A streamed answer reassembles into exactly the whole one; so a call cut off
 * by max_tokens is an unfinished call in both (as OpenAI's are). The one
 * exception is a call malformed after its name (possible only with
 * tool_choice auto): streamed, its start has gone out; whole, it is content.
 */
import type { ToolParser } from "./tool-parsers.js";
import { ThinkSplitter, type ReasoningSplit } from "./reasoning-parser.js";

export interface ToolCallPolicy {
  parser: ToolParser;
  /** tool_choice naming a function: only calls to it count. */
  named: string | null;
  /** parallel_tool_calls false: only the first call counts. */
  parallel: boolean;
}

/** How one request's chat output is parsed; null fields: that parser is off. */
export interface ChatOutputSpec {
  reasoning: { promptOpensThink: boolean } | null;
  tools: ToolCallPolicy | null;
}

export interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** One streamed piece of a tool call, in OpenAI's delta shape: the first for a call has id, type and name. */
export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: "function";
  function: { name?: string; arguments: string };
}

export interface ChatPiece extends ReasoningSplit {
  toolCalls: ToolCallDelta[];
}

/** A whole answer. */
export interface ChatAnswer extends ReasoningSplit {
  toolCalls: ToolCall[];
}

/** Holds content from the first possible tool-call start; streams calls as they are read (when `incremental`). */
class ToolGate {
  private held = "";
  private inCalls = false;
  /** Content other than whitespace has been sent. */
  private anyText = false;
  /** The calls streamed so far, with the arguments sent. */
  private readonly sent: ToolCall[] = [];

  constructor(private readonly policy: ToolCallPolicy, private readonly incremental: boolean) {}

  push(content: string): { content: string; deltas: ToolCallDelta[] } {
    this.held += content;
    if (this.inCalls) return { content: "", deltas: this.stream() };
    const start = this.policy.parser.findStart(this.held);
    // Whitespace before any text is held: before calls it is no content (the whole answer's is then null).
    const onlySpace = (t: string): boolean => !this.anyText && t.trim() === "";
    if (start >= 0) {
      this.inCalls = true;
      const before = this.held.slice(0, start);
      this.held = this.held.slice(start);
      return { content: onlySpace(before) ? "" : before, deltas: this.stream() };
    }
    const ready = this.held.slice(0, this.held.length - this.policy.parser.pending(this.held));
    if (onlySpace(ready)) return { content: "", deltas: [] };
    this.anyText = true;
    this.held = this.held.slice(ready.length);
    return { content: ready, deltas: [] };
  }

  /** Does the policy let the i-th call named `name` count? */
  private counts(i: number, name: string): boolean {
    return (this.policy.parallel || i === 0) && (this.policy.named === null || this.policy.named === name);
  }

  /** The deltas that bring the streamed calls up to the calls read so far. */
  private stream(): ToolCallDelta[] {
    if (!this.incremental) return [];
    const deltas: ToolCallDelta[] = [];
    const calls = this.policy.parser.partial(this.held);
    for (let i = 0; i < calls.length && this.counts(i, calls[i]!.name); i++) deltas.push(...this.advance(i, calls[i]!.name, calls[i]!.arguments));
    return deltas;
  }

  /** Call i is now known as far as `args`: its opening delta if new, then the arguments not yet sent. */
  private advance(i: number, name: string, args: string): ToolCallDelta[] {
    const out: ToolCallDelta[] = [];
    let call = this.sent[i];
    if (!call) {
      call = { id: this.policy.parser.newId(), type: "function", function: { name, arguments: "" } };
      this.sent[i] = call;
      out.push({ index: i, id: call.id, type: "function", function: { name, arguments: "" } });
    }
    const before = call.function.arguments;
    if (args.length > before.length && args.startsWith(before)) {
      out.push({ index: i, function: { arguments: args.slice(before.length) } });
      call.function.arguments = args;
    }
    return out;
  }

  /** `cut`: max_tokens ended the text, so the calls read so far are the answer's, the last maybe unfinished. */
  finish(cut: boolean): { content: string; calls: ToolCall[]; deltas: ToolCallDelta[] } {
    const region = this.held;
    this.held = "";
    const parsed = this.inCalls ? this.policy.parser.parse(region) : null;
    const { named } = this.policy;
    let found = parsed?.calls ?? [];
    // A call to another function than the one named is not the answer asked for.
    if (!parsed || (named !== null && parsed.calls.some((c) => c.name !== named))) {
      const read = this.inCalls ? this.policy.parser.partial(region) : [];
      const stop = read.findIndex((c, i) => !this.counts(i, c.name));
      const counted = stop < 0 ? read : read.slice(0, stop);
      // Otherwise what was streamed as calls stays calls, and text that never was is content as it is.
      if (!cut || counted.length === 0) return this.sent.length > 0 ? { content: "", calls: this.sent, deltas: [] } : { content: region, calls: [], deltas: [] };
      found = counted;
    }
    if (!this.policy.parallel) found = found.slice(0, 1);
    const deltas = found.flatMap((c, i) => this.advance(i, c.name, c.arguments));
    const calls = found.map((c, i): ToolCall => ({ id: this.sent[i]!.id, type: "function", function: { name: c.name, arguments: c.arguments } }));
    // Cut, text after the calls may be the unfinished start of one more: it is no content.
    const text = parsed?.text ?? "";
    return { content: cut ? text.slice(0, text.length - this.policy.parser.pending(text)) : text, calls, deltas };
  }
}

export class ChatOutput {
  private readonly think: ThinkSplitter | null;
  private readonly gate: ToolGate | null;
  private done: ToolCall[] = [];

  /** `incremental` (streaming): tool calls are sent as they are read; otherwise only at the end. */
  constructor(spec: ChatOutputSpec, incremental = true) {
    this.think = spec.reasoning ? new ThinkSplitter(spec.reasoning.promptOpensThink) : null;
    this.gate = spec.tools ? new ToolGate(spec.tools, incremental) : null;
  }

  /** What of `text` can be sent now. */
  push(text: string): ChatPiece {
    const split = this.think ? this.think.push(text) : { reasoning: "", content: text };
    if (!this.gate) return { ...split, toolCalls: [] };
    const gated = this.gate.push(split.content);
    return { reasoning: split.reasoning, content: gated.content, toolCalls: gated.deltas };
  }

  /** The rest, at the end of generation; `cut`: max_tokens ended it. */
  finish(cut = false): ChatPiece {
    const split = this.think ? this.think.finish() : { reasoning: "", content: "" };
    if (!this.gate) return { ...split, toolCalls: [] };
    const last = this.gate.push(split.content);
    const end = this.gate.finish(cut);
    this.done = end.calls;
    return { reasoning: split.reasoning, content: last.content + end.content, toolCalls: [...last.deltas, ...end.deltas] };
  }

  /** The answer's tool calls, once finished. */
  get calls(): readonly ToolCall[] {
    return this.done;
  }

  /** A whole output at once; `cut`: max_tokens ended it. */
  static parse(spec: ChatOutputSpec, text: string, cut = false): ChatAnswer {
    const out = new ChatOutput(spec, false);
    const first = out.push(text);
    const rest = out.finish(cut);
    return { reasoning: first.reasoning + rest.reasoning, content: first.content + rest.content, toolCalls: out.done };
  }
}
